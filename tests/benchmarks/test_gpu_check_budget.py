"""benchmarks/gpu_check.sh stays inside its time budget (a lent GPU runs one command of at most 10 minutes): with a
stand-in interpreter that takes 2 s per call and a 12 s budget, the first steps run (4 s or more of slack, so a
loaded machine does not cut them), the last is skipped (125), and the script ends within the budget."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_keeps_to_its_budget(tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/usr/bin/env bash\nsleep 2\n")
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake), "BUDGET_S": "12", "MIN_STEP_S": "1"}
    t0 = time.monotonic()
    p = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(tmp_path / "out")], env=env,
                       capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    summary = (tmp_path / "out" / "summary.txt").read_text()
    codes = [int(c) for c in re.findall(r": exit (\d+) in", summary)]
    assert codes[:2] == [0, 0], summary  # the GPU tests and the FSDP2 check ran (2 s each)
    assert 125 in codes and codes[-1] == 125, summary  # the last steps were skipped: no budget left
    assert p.returncode != 0  # a skipped step is not a pass
    assert took < 12 + 4, f"the script took {took:.1f} s for a 12 s budget"
    assert re.search(r"total: \d+s of a 12s budget", summary)
