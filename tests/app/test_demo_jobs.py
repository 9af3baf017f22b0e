"""The demo's jobs after SFT run side by side (app/demo_jobs.py): longest first, on demo.lanes processes with their
share of the CPUs; a job that fails stops the demo with its error and ends the lanes still running. (That a lane
dies with the demo, whatever ended it, with its environment workers: tests/envs/test_envs_owner_death.py.)"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from seedfast.app.demo_jobs import CONTROL, SFT_EVAL, job_names, run_jobs, start_lanes
from seedfast.config import load_config
from tests.app.lane_jobs import fail_first_else_hang, where


def test_job_names_put_the_longest_first():
    cfg = load_config(None, ["demo.algorithms=[seed,grpo]"])
    assert job_names(cfg) == ["seed", "grpo", CONTROL, SFT_EVAL]


@pytest.mark.parametrize("lanes,threads", [(1, 2), (2, 1)])
def test_jobs_run_on_the_lanes_with_their_share_of_the_cpus(tmp_path, lanes, threads):
    cfg = load_config(None, [f"demo.lanes={lanes}"])
    done = []
    results = run_jobs(cfg, tmp_path, cpus=2, on_done=lambda r: done.append(r.name), job=where)
    assert list(results) == job_names(cfg) and sorted(done) == sorted(results)
    pids = {r.evaluation["pid"] for r in results.values()}
    assert os.getpid() not in pids and len(pids) == min(lanes, len(results))
    assert {r.evaluation["threads"] for r in results.values()} == {threads}



def test_lanes_started_before_sft_run_the_jobs(tmp_path):
    """The demo starts the lanes' processes before SFT (start_lanes): they exist before any job, and they are the
    processes that run the jobs."""
    cfg = load_config(None, ["demo.lanes=2"])
    before = {p.pid for p in multiprocessing.active_children()}
    lanes = start_lanes(cfg, cpus=2)
    started = {p.pid for p in multiprocessing.active_children()} - before
    assert len(started) == 2
    results = run_jobs(cfg, tmp_path, cpus=2, job=where, lanes=lanes)
    assert {int(r.evaluation["pid"]) for r in results.values()} == started
    assert {r.evaluation["threads"] for r in results.values()} == {1}


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_failing_job_stops_the_demo_and_ends_the_other_lanes(tmp_path):
    cfg = load_config(None, ["demo.lanes=2"])
    with pytest.raises(ValueError, match="failed on purpose"):
        run_jobs(cfg, tmp_path, cpus=2, job=fail_first_else_hang)
    hanging = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert hanging  # the other lane (and maybe the failed one, on its next job)
    deadline = time.monotonic() + 20
    while not all(_gone(pid) for pid in hanging):
        assert time.monotonic() < deadline, f"lane {hanging} still running 20 s after the failure"
        time.sleep(0.05)
