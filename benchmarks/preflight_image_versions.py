"""The GPU image's versions on a CPU machine first: torch 2.11.0, Triton 3.6.0 and transformers 5.17
(requirements/lock-gpu-image.txt) in a venv of their own, and the CPU suite's subsets that touch them, so that version
skew shows here, not in the 15-minute GPU window.

    python3 -m benchmarks.preflight_image_versions          # or: make preflight
        [--venv .venv-image] [--out benchmarks/results/preflight_image_versions.json] [--subsets kernels hf ...]

Makes the venv when missing (torch from the PyTorch CPU index as 2.11.0+cpu where reachable, else PyPI's default
Linux wheel of 2.11.0, a CUDA build that runs on CPU too; the rest with requirements/lock-cpu.txt's versions less
torch, triton, transformers, huggingface-hub and nvidia-*/cuda-*), then runs, one pytest process per subset, each with
its JUnit file and a per-test timeout:
    import        every seedfast module imports, and the import-direction test
    kernels       tests/kernels and tests/ops: the Triton kernels under TRITON_INTERPRET=1 with Triton 3.6
    hf            the HF twin and transformers: parity, HF folder I/O, configs, tokenizer, RoPE
    distributed   tests/distributed on gloo: FSDP2, tensor parallel (the private torch.distributed.tensor._utils
                  import), the vocabulary-parallel head, DCP, torchrun
and two static checks of the installed torch: the private import, and whether its libtorch_cuda accepts an fp32 C
beside bf16 matrices in addmm's out_dtype form (the single pass's GEMMs, seedfast/ops/triton_backend.py). Writes a
JSON of what ran and passed (versions, per subset: the command, counts, failing test names, seconds). Exit status 1 if
anything failed. Run it when the machine is otherwise idle (it is niced): about 10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements" / "lock-gpu-image.txt"
MAIN_LOCK = REPO / "requirements" / "lock-cpu.txt"
# lines of the main lock that the image's lock replaces (or that a CUDA wheel of torch brings itself)
REPLACED = ("torch", "triton", "transformers", "huggingface-hub", "huggingface_hub")
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

SUBSETS = {
    "import": ["tests/test_import_direction.py"],
    "kernels": ["tests/kernels", "tests/ops"],
    "hf": ["tests/model/test_hf_parity.py", "tests/model/test_hf_io.py", "tests/model/test_decoder_config.py",
           "tests/model/test_tokenizer.py", "tests/model/test_rope.py"],
    "distributed": ["tests/distributed"],
}
PER_TEST_TIMEOUT_S = 600

IMPORT_ALL = """
import importlib, pkgutil, seedfast
names = sorted(m.name for m in pkgutil.walk_packages(seedfast.__path__, "seedfast."))
OPTIONAL = {"textworld", "vllm", "flash_attn", "liger_kernel", "gguf"}  # extras the image does not have either
bad, optional = [], []
for name in names:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as err:
        (optional if err.name in OPTIONAL else bad).append(f"{name}: needs {err.name}")
    except Exception as err:  # noqa: BLE001 - every failing module is reported
        bad.append(f"{name}: {type(err).__name__}: {err}")
print(len(names), "modules;", len(bad), "failed;", len(optional), "need an optional package the image lacks")
print("\\n".join(bad + optional))
raise SystemExit(1 if bad else 0)
"""

STATIC = """
import json, pathlib, torch
out = {}
try:
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # noqa: F401
    out["private_dtensor_utils_import"] = "ok"
except ImportError as err:
    out["private_dtensor_utils_import"] = f"ImportError: {err}"
lib = next(iter(pathlib.Path(torch.__file__).parent.joinpath("lib").glob("libtorch_cuda.so")), None)
if lib is None:
    out["addmm_fp32_c_on_cuda"] = "no libtorch_cuda in this build (a +cpu wheel): not checked"
else:
    data = lib.read_bytes()
    new = b"self dtype must match either out_dtype or mat1 dtype" in data
    old = b"self and mat2 must have the same dtype" in data
    out["addmm_fp32_c_on_cuda"] = ("accepted: the check reads 'self dtype must match either out_dtype or mat1 dtype'"
                                   if new and not old else "rejected: self must have mat2's dtype" if old
                                   else "unknown: neither check string found")
print(json.dumps(out))
"""


def _py(venv: Path) -> str:
    return str(venv / "bin" / "python")


def _run(cmd: list[str], log: Path | None = None, env: dict | None = None, timeout: int | None = None) -> int:
    print("$", " ".join(cmd)[:300], flush=True)
    with open(log, "w") if log else open(os.devnull, "w") as sink:
        return subprocess.run(cmd, cwd=REPO, env=env, stdout=sink if log else None, stderr=subprocess.STDOUT,
                              timeout=timeout).returncode


def make_venv(venv: Path) -> None:
    stamp = venv / ".installed"
    lock_text = LOCK.read_text()
    if stamp.exists() and stamp.read_text() == lock_text:
        return
    if not (venv / "bin" / "python").exists():
        _run([sys.executable, "-m", "venv", str(venv)])
    pins = {line.split("==")[0].strip().lower(): line.strip() for line in lock_text.splitlines()
            if "==" in line and not line.startswith("#")}
    constraints = venv / "constraints.txt"
    keep = [line for line in MAIN_LOCK.read_text().splitlines() if "==" in line and not line.startswith("#")
            and not line.split("==")[0].strip().lower().startswith(("nvidia-", "cuda-"))
            and line.split("==")[0].strip().lower() not in REPLACED]
    constraints.write_text("\n".join([*pins.values(), *keep]) + "\n")
    pip = [_py(venv), "-m", "pip", "install", "-q"]
    if _run([*pip, "--index-url", TORCH_CPU_INDEX, pins["torch"] + "+cpu"], timeout=900) != 0:
        print(f"{TORCH_CPU_INDEX} not reachable: PyPI's {pins['torch']} (a CUDA build; it runs on CPU)", flush=True)
    if _run([*pip, pins["torch"], pins["triton"]]) != 0:
        raise SystemExit(f"could not install {pins['torch']} and {pins['triton']}")
    if _run([*pip, "-c", str(constraints), "-e", ".[dev]"]) != 0:
        raise SystemExit("could not install seedfast with the image's versions")
    stamp.write_text(lock_text)


def versions(venv: Path) -> dict:
    code = ("import json, sys, platform, torch, triton, transformers, huggingface_hub as h; print(json.dumps({"
            "'python': platform.python_version(), 'torch': torch.__version__, 'triton': triton.__version__, "
            "'transformers': transformers.__version__, 'huggingface_hub': h.__version__}))")
    out = subprocess.run([_py(venv), "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def junit_counts(path: Path) -> dict:
    """passed / failed / errors / skipped and the names of the failing tests, from a pytest JUnit file."""
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failing": []}
    if not path.exists():
        counts["errors"] = 1
        counts["failing"].append(f"no JUnit file ({path.name}): pytest did not finish")
        return counts
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            counts["failed"] += 1
            counts["failing"].append(name)
        elif "error" in kinds:
            counts["errors"] += 1
            counts["failing"].append(name)
        elif "skipped" in kinds:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts


def run_subset(venv: Path, name: str, logs: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("TRITON_INTERPRET", None)
    t0 = time.monotonic()
    result: dict = {"files": SUBSETS[name]}
    if name == "import":
        rc = _run([_py(venv), "-c", IMPORT_ALL], logs / "import_all.log", env)
        result["import_all"] = (logs / "import_all.log").read_text().strip().splitlines()[:20]
        result["import_all_ok"] = rc == 0
    junit = logs / f"{name}.xml"
    cmd = [_py(venv), "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", f"--timeout={PER_TEST_TIMEOUT_S}",
           f"--junitxml={junit}", *SUBSETS[name]]
    result["command"] = " ".join(["pytest", *cmd[3:-len(SUBSETS[name])], *SUBSETS[name]]).replace(str(logs), "LOGS")
    rc = _run(["nice", "-n", "10", *cmd], logs / f"{name}.log", env)
    result.update(junit_counts(junit), exit_code=rc, seconds=round(time.monotonic() - t0, 1))
    tail = (logs / f"{name}.log").read_text().strip().splitlines()
    result["summary_line"] = tail[-1] if tail else ""
    result["ok"] = rc == 0 and result["failed"] == 0 and result["errors"] == 0 and result.get("import_all_ok", True)
    print(f"{name}: {result['summary_line']} ({result['seconds']} s)", flush=True)
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", default=str(REPO / ".venv-image"))
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "preflight_image_versions.json"))
    ap.add_argument("--subsets", nargs="+", default=list(SUBSETS), choices=list(SUBSETS))
    ap.add_argument("--commit", default=os.environ.get("SEEDFAST_COMMIT"), help="the commit tested (default: git)")
    args = ap.parse_args(argv)
    venv = Path(args.venv)
    make_venv(venv)
    logs = venv / "preflight_logs"
    logs.mkdir(exist_ok=True)
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                           text=True).stdout.strip() or None
    static = json.loads(subprocess.run([_py(venv), "-c", STATIC], cwd=REPO, capture_output=True, text=True,
                                       check=True).stdout.strip().splitlines()[-1])
    t0 = time.monotonic()
    subsets = {name: run_subset(venv, name, logs) for name in args.subsets}
    report = {
        "what": "the CPU suite's import, kernel-interpreter, HF and distributed subsets under the GPU image's versions "
                "(requirements/lock-gpu-image.txt), before a GPU window",
        "commit": commit, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "load_avg_at_start": os.getloadavg()[0]},
        "versions": versions(venv), "image_versions": {"python": "3.12", "torch": "2.11.0+cu130", "triton": "3.6.0",
                                                       "transformers": "5.17"},
        "static_checks": static, "subsets": subsets, "seconds": round(time.monotonic() - t0, 1),
        "ok": all(s["ok"] for s in subsets.values()) and static["private_dtensor_utils_import"] == "ok",
    }
    out = Path(args.out)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    tmp.replace(out)
    print(f"wrote {out}: {'all passed' if report['ok'] else 'FAILED'}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
