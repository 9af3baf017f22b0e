"""benchmarks/gpu_check.sh on CPU with stand-in interpreters (a lent GPU runs one command of at most 10 minutes and
brings back at most 8 files): it calls the image's python3 (or $PYTHON), never make, python or a venv; runs the
headline steps first (GEMM reference, kernels at N=16384, gpu tests, reduced step, the rest); gives each step its
cold-machine limit; kills a step that ignores SIGTERM (timeout -k) and still ends inside the budget; writes at most
8 plain files directly under OUT."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ORDER = ["gemm", "kernels", "tests", "step", "rest"]

# Records each call; writes the files a real run would (--out X, --junitxml=X, gemm_reference.py's OUT); a call
# whose arguments match $HANG ignores SIGTERM and sleeps.
FAKE_PYTHON = r"""#!/usr/bin/env bash
printf '%s\n' "$(printf '%s ' "$0" "$@" | tr '\n' ' ' | cut -c1-400)" >> "$CALLS"
prev=
for a in "$@"; do
  case "$a" in --junitxml=*) echo '<testsuites/>' > "${a#--junitxml=}" ;; esac
  [ "$prev" = --out ] && echo '{}' > "$a"
  [ "${prev##*/}" = gemm_reference.py ] && echo '{"gemm_tflops": 1.0}' > "$a"
  prev=$a
done
if [ -n "${HANG:-}" ] && [[ "$*" == *"$HANG"* ]]; then trap '' TERM; sleep 60; fi
sleep 0.1
"""
FORBIDDEN = "#!/usr/bin/env bash\necho \"FORBIDDEN $0 $*\" >> \"$CALLS\"\n"


def _run(tmp_path, **env_extra):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("python3", FAKE_PYTHON), ("python", FORBIDDEN), ("make", FORBIDDEN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "VIRTUAL_ENV", "HANG")}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", CALLS=str(calls), MIN_STEP_S="1", KILL_S="1", **env_extra)
    out = tmp_path / "out"
    t0 = time.monotonic()
    p = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(out)], env=env, capture_output=True,
                       text=True, timeout=120)
    took = time.monotonic() - t0
    summary = (out / "summary.txt").read_text()
    steps = re.findall(r"^(\w+): exit (\d+) in \d+s \(limit (\d+)s of own (\d+)s", summary, re.M)
    return p, took, summary, steps, calls.read_text(), out


def test_all_steps_in_order_with_python3_and_at_most_8_files(tmp_path):
    p, _, summary, steps, calls, out = _run(tmp_path, BUDGET_S="300")
    assert [s[0] for s in steps] == ORDER, summary
    assert all(rc == "0" for _, rc, _, _ in steps), summary
    assert p.returncode == 0, p.stdout + p.stderr
    assert "FORBIDDEN" not in calls and "venv" not in calls and "activate" not in calls, calls
    lines = calls.splitlines()
    assert lines and all(line.split()[0].endswith("/bin/python3") for line in lines), calls

    def first(pattern):
        return next(i for i, line in enumerate(lines) if re.search(pattern, line))

    order = [first(r"gemm_reference\.py"), first(r"kernels\.py --n 16384"), first(r"-m pytest -m gpu tests/kernels"),
             first(r"step_gpu\.py"), first(r"peers\.py")]
    assert order == sorted(order), calls
    # the cold-machine limits: gpu tests 150-300 s (autotune compiles), the step 120-200 s
    own = {name: int(o) for name, _, _, o in steps}
    assert 150 <= own["tests"] <= 300 and 120 <= own["step"] <= 200, own
    assert sum(own[s] for s in ORDER[:4]) <= 570 - 20  # the headline steps fit the default budget
    files = list(out.iterdir())
    assert all(f.is_file() for f in files) and len(files) <= 8, sorted(f.name for f in files)
    assert {"summary.txt", "window.log", "gemm_reference.json", "kernels.json", "pytest_gpu.log", "pytest_gpu.xml",
            "step_gpu.json"} <= {f.name for f in files}


def test_a_step_that_ignores_sigterm_is_killed_and_the_budget_holds(tmp_path):
    p, took, summary, steps, calls, out = _run(tmp_path, BUDGET_S="8", HANG="step_gpu.py")
    codes = {name: int(rc) for name, rc, _, _ in steps}
    assert codes["gemm"] == codes["kernels"] == codes["tests"] == 0, summary
    assert codes["step"] == 137, summary  # SIGKILL, KILL_S after the SIGTERM it ignored
    assert codes["rest"] == 125, summary  # no budget left: skipped, reported
    assert p.returncode != 0  # a killed or skipped step is not a pass
    assert took < 8 + 4, f"the script took {took:.1f} s for an 8 s budget"
    assert re.search(r"total: \d+s of a 8s budget", summary)
