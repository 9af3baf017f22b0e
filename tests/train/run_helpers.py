"""Helpers of the tests that run `seedfast train` in processes of their own and compare their metrics.jsonl
(tests/train/test_async_producer.py, tests/distributed/test_async_torchrun.py)."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from seedfast.runtime.checkpoint import list_checkpoints

# keys that differ between two runs of one seed whatever the loop (clocks, memory) or that only the asynchronous
# loop writes (the producer's weight send)
VOLATILE = ("time/", "throughput/", "memory/", "async/")


def one_thread_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def metrics_lines(out: Path) -> list[dict]:
    """Every line of the run `t`'s metrics.jsonl under `out` (none while it does not exist)."""
    path = out / "t" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def stable_rows(out: Path) -> list[dict]:
    """The run's per-update records less the VOLATILE keys: what two runs of one seed must agree on."""
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in metrics_lines(out) if "step" in r]


def run_until_checkpoint(cmd: list[str], ckpt_dir: Path, step: int, timeout: float = 300) -> None:
    """Start `cmd` and kill -9 it as soon as its checkpoint step_<step> is in place."""
    proc = subprocess.Popen(cmd, env=one_thread_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.name == f"step_{step}" for p in list_checkpoints(ckpt_dir)):
            break
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
