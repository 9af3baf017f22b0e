"""benchmarks/gpu_check.sh on CPU with stand-in interpreters (a lent GPU gets 15 minutes of device time, machine start
included, one command of at most 10 minutes, at most 8 files back): --dry-run prints the plan and refuses one over
budget; a run calls the image's python3 (or $PYTHON), never make, python or a venv; runs the headline steps first
(GEMM reference, kernels at the model's shape, gpu tests of kernels/ops with each file in its own process, FSDP on
one GPU, the reduced step with sdpa attention, the rest); passes the commit in; kills a step that ignores SIGTERM and
still ends inside the budget; writes at most 8 plain files directly under OUT."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
ORDER = ["gemm", "kernels", "divergence", "tests", "fsdp", "step", "rest"]

# Records each call; writes the files a real run would (--out X, --junitxml=X, gemm_reference's OUT); `-c` probes
# succeed; `-` (the JUnit merge, stdlib only) runs on the real interpreter. A pytest call on a file matching $CRASH
# exits 134 (an illegal memory access kills the process); a call matching $HANG ignores SIGTERM and sleeps.
FAKE_PYTHON = r"""#!/usr/bin/env bash
printf '%s\n' "$(printf '%s ' "$0" "$@" | tr '\n' ' ' | cut -c1-400)" >> "$CALLS"
[ "${1:-}" = - ] && exec "$REAL_PYTHON" "$@"
[ "${1:-}" = -c ] && exit 0
prev=
for a in "$@"; do
  case "$a" in --junitxml=*) printf '<testsuite name="%s"><testcase classname="c" name="t"/></testsuite>' \
    "$(basename "${a#--junitxml=}")" > "${a#--junitxml=}" ;; esac
  [ "$prev" = --out ] && echo '{}' > "$a"
  [ "$prev" = benchmarks.gemm_reference ] && echo '{"gemm_tflops": 1.0}' > "$a"
  prev=$a
done
if [ -n "${CRASH:-}" ] && [[ "$*" == *"$CRASH"* ]]; then echo "CUDA error: an illegal memory access"; exit 134; fi
if [ -n "${HANG:-}" ] && [[ "$*" == *"$HANG"* ]]; then trap '' TERM; sleep 60; fi
sleep 0.05
"""
FORBIDDEN = "#!/usr/bin/env bash\necho \"FORBIDDEN $0 $*\" >> \"$CALLS\"\n"


def _env(tmp_path, **extra):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("python3", FAKE_PYTHON), ("python", FORBIDDEN), ("make", FORBIDDEN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHON", "VIRTUAL_ENV", "HANG", "CRASH", "COMMIT", "SEEDFAST_COMMIT", "BUDGET_S", "STEPS")}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", CALLS=str(tmp_path / "calls.txt"), REAL_PYTHON=sys.executable)
    env.update({"MIN_STEP_S": "1", "KILL_S": "1", **extra})
    return env


def _dry(tmp_path, **extra):
    env = _env(tmp_path, **extra)
    for key in ("MIN_STEP_S", "KILL_S"):  # the script's own defaults
        if key not in extra:
            env.pop(key)
    return subprocess.run(["bash", str(SCRIPT), "--dry-run"], env=env, capture_output=True, text=True, timeout=60)


def _run(tmp_path, *args, **extra):
    env = _env(tmp_path, **extra)
    out = tmp_path / "out"
    t0 = time.monotonic()
    p = subprocess.run(["bash", str(SCRIPT), *args, str(out)], env=env, capture_output=True, text=True, timeout=180)
    took = time.monotonic() - t0
    summary = (out / "summary.txt").read_text()
    steps = re.findall(r"^(\w+): exit (\d+) in \d+s \(limit (\d+)s of own (\d+)s", summary, re.M)
    return p, took, summary, steps, (tmp_path / "calls.txt").read_text(), out


def test_dry_run_prints_a_plan_that_fits_the_window(tmp_path):
    p = _dry(tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    limits = dict(re.findall(r"^  (\w+)\s+limit\s+(\d+)s", p.stdout, re.M))
    assert list(limits) == ORDER, p.stdout
    pattern = r"sum of step limits: (\d+)s \(\d+ steps, each with (\d+)s of kill grace\) of a (\d+)s budget"
    total, kill, budget = map(int, re.search(pattern, p.stdout).groups())
    assert total == sum(int(v) + kill for v in limits.values()) and kill >= 1
    assert total <= budget
    start, runs, per_run, transfer, window, device = map(int, re.search(
        r"window: start (\d+)s \+ (\d+) runs x \((\d+)s \+ (\d+)s transfer\) = (\d+)s of (\d+)s", p.stdout).groups())
    assert runs == 2 and per_run == budget and window == start + 2 * (budget + transfer) <= device == 900
    assert start >= 60  # a machine's start takes minutes
    outputs = re.search(r"outputs \((\d+), at most 8\): (.*)", p.stdout)
    assert int(outputs.group(1)) == len(outputs.group(2).split()) <= 8
    assert "plan fits" in p.stdout and not (tmp_path / "calls.txt").exists()  # nothing ran


def test_dry_run_refuses_a_plan_over_budget(tmp_path):
    short = _dry(tmp_path, BUDGET_S="200")  # the steps' limits no longer fit one run
    assert short.returncode == 2 and "REFUSED: step limits add up to" in short.stdout, short.stdout
    slow_start = _dry(tmp_path, START_S="400", BUDGET_S="300")  # a run and a rerun no longer fit the 15 minutes
    assert slow_start.returncode == 2 and "REFUSED: a run and a rerun need" in slow_start.stdout, slow_start.stdout
    # a real run refuses the same plan before it starts anything
    p = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "o")], env=_env(tmp_path, BUDGET_S="200"),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and not (tmp_path / "o").exists()


def test_all_steps_in_order_with_python3_and_at_most_8_files(tmp_path):
    p, _, summary, steps, calls, out = _run(tmp_path, "--commit", "0123abc")
    assert [s[0] for s in steps] == ORDER, summary
    assert all(rc == "0" for _, rc, _, _ in steps), summary
    assert p.returncode == 0, p.stdout + p.stderr
    assert "commit: 0123abc" in summary
    assert "FORBIDDEN" not in calls and "venv" not in calls and "activate" not in calls, calls
    lines = calls.splitlines()
    assert lines and all(line.split()[0].endswith("/bin/python3") for line in lines), calls

    def first(pattern):
        return next(i for i, line in enumerate(lines) if re.search(pattern, line))

    order = [first(r"-m benchmarks\.gemm_reference "), first(r"-m benchmarks\.kernels --n 16384 --d 4096 --v 152064"),
             first(r"-m benchmarks\.kernels --divergence --n 4096 --d 896 --v 151936"),
             first(r"-m pytest -m gpu tests/kernels/"), first(r"-m pytest -m gpu tests/distributed/test_fsdp_one"),
             first(r"-m benchmarks\.step_gpu .*--attn sdpa --commit 0123abc"), first(r"-m pytest -m gpu tests/model/")]
    assert order == sorted(order), calls
    pytest_calls = [line for line in lines if "-m pytest" in line]
    assert all(len(re.findall(r" tests/\S+\.py", line)) == 1 for line in pytest_calls), pytest_calls  # one file each
    assert all("--timeout=60" in line and "--junitxml=" in line for line in pytest_calls)
    assert not any("benchmarks.peers" in line or "tests/rollout/" in line or "vllm_real" in line for line in lines)
    files = list(out.iterdir())
    assert all(f.is_file() for f in files) and len(files) <= 8, sorted(f.name for f in files)
    assert {f.name for f in files} == {"summary.txt", "window.log", "gemm_reference.json", "kernels.json",
                                       "divergence.json", "pytest_gpu.log", "pytest_gpu.xml", "step_gpu.json"}
    merged = (out / "pytest_gpu.xml").read_text()
    assert merged.count("<testsuite ") == len(pytest_calls)  # every file's JUnit, merged into one


def test_a_crashing_test_file_costs_that_file_only(tmp_path):
    p, _, summary, steps, calls, out = _run(tmp_path, CRASH="test_triton_gpu.py")
    codes = {name: int(rc) for name, rc, _, _ in steps}
    assert codes["tests"] == 1 and p.returncode != 0, summary  # reported
    log = (out / "pytest_gpu.log").read_text()
    assert "FAILED FILE tests/kernels/test_triton_gpu.py (exit 134" in log
    after = [f for f in re.findall(r"^### (\S+)", log, re.M) if f.startswith("tests/kernels/")]
    assert after.index("tests/kernels/test_triton_gpu.py") < after.index("tests/kernels/test_triton_gpu_risks.py")
    assert codes["fsdp"] == codes["step"] == codes["rest"] == 0  # the files and steps after it still ran


def test_a_step_that_ignores_sigterm_is_killed_and_the_budget_holds(tmp_path):
    # limits 2 + 2 + 3 + 12 s, each with 1 s of kill grace: 23 s, the whole budget; rest's 12 s leave its 5 files
    # (each started only with 5 s left, merged by the real interpreter after it) 6 s on a loaded 2-core box
    p, took, summary, steps, calls, out = _run(tmp_path, BUDGET_S="23", STEPS="gemm kernels step rest",
                                               LIMITS="gemm=2 kernels=2 step=3 rest=12", HANG="benchmarks.step_gpu")
    codes = {name: int(rc) for name, rc, _, _ in steps}
    assert codes["gemm"] == codes["kernels"] == 0, summary
    assert codes["step"] == 137, summary  # SIGKILL, KILL_S after the SIGTERM it ignored
    assert codes["rest"] == 0, summary  # the plan left it its time
    assert p.returncode != 0  # a killed step is not a pass
    assert took < 23 + 3, f"the script took {took:.1f} s for a 23 s budget"
    assert re.search(r"total: \d+s of a 23s budget", summary)


def test_a_step_with_no_budget_left_is_skipped_and_reported(tmp_path):
    # a plan that fits on paper, but the time is gone (a slow start): what is left goes by, nothing runs past it
    p, took, summary, steps, calls, out = _run(tmp_path, BUDGET_S="7", STEPS="gemm step rest", MIN_STEP_S="4",
                                               LIMITS="gemm=1 step=2 rest=1", HANG="benchmarks.step_gpu")
    codes = {name: int(rc) for name, rc, _, _ in steps}
    assert codes["step"] == 137 and codes["rest"] == 125, summary  # 125: skipped, budget
    assert p.returncode != 0 and took < 7 + 3
