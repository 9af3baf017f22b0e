"""Jobs for tests of app/demo_jobs.run_jobs. They run in the lanes' spawned processes, which import this module
(spawn gives them the test's sys.path), so they cannot live in a test module."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from seedfast.app.demo_jobs import JobResult, job_names


def where(cfg, name: str, out: Path) -> JobResult:
    """Which process ran the job, with how many torch threads; the first jobs wait until one has started on each
    lane (so the lanes are shown to run side by side)."""
    (out / f"{name}.started").write_text("")
    side_by_side = min(cfg.demo.lanes, len(job_names(cfg)))
    deadline = time.monotonic() + 60
    while len(list(out.glob("*.started"))) < side_by_side and time.monotonic() < deadline:
        time.sleep(0.02)
    return JobResult(name, [], {"pid": float(os.getpid()), "threads": float(torch.get_num_threads())}, None, 0.0,
                     time.time())


def fail_first_else_hang(cfg, name: str, out: Path) -> JobResult:
    """The first job fails once the others have started; the others record their process and hang."""
    if name != job_names(cfg)[0]:
        tmp = out / f".{name}.pid.tmp"  # renamed whole: the failing job may end this lane as soon as it sees the file
        tmp.write_text(str(os.getpid()))
        tmp.rename(out / f"{name}.pid")
        time.sleep(600)
    while not list(out.glob("*.pid")):
        time.sleep(0.05)
    raise ValueError(f"job {name} failed on purpose")
