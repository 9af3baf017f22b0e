"""No process an EnvPool starts outlives its owner: SIGTERM or SIGKILL of the owner while its workers start, reset or
step leaves nothing behind (#22 item 7: 300 orphaned workers once took the machine down).

The owner is a script run as a subprocess with a marker in its environment, which every process it starts inherits
whatever becomes of the owner; the test looks for the marker in /proc to find them all."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")

GONE_WITHIN_S = 20.0  # the bound #22 measured for a steady evaluation

OWNER = '''
import os, sys, time

if __name__ == "__mp_main__" and os.environ.get("SLOW_MAIN_IMPORT"):
    time.sleep(3)  # a worker that imports a heavy main module (torch) starts slowly: the 'starting' state

from seedfast.envs.base import Observation
from seedfast.envs.workers import EnvPool


class SlowEnv:
    def __init__(self, spec):
        self.spec = spec

    def reset(self):
        time.sleep(1.0 if self.spec == "slow" else 0.0)
        return Observation("start", "wait", ["wait"])

    def step(self, action):
        time.sleep(0.2)
        return Observation("waited", "wait", ["wait"]), 0.0, False, {"won": False, "valid": True}

    def close(self):
        pass


if __name__ == "__main__":
    state, method = sys.argv[1], sys.argv[2]
    pool = EnvPool(16, SlowEnv, processes=2, start_method=method, step_timeout=600, reset_timeout=600)
    print("started", flush=True)
    if state == "resetting":
        print("resetting", flush=True)
        pool.reset(["slow"] * 16)  # 8 slow resets per worker
        print("reset done", flush=True)
    elif state == "stepping":
        pool.reset(["fast"] * 16)
        print("stepping", flush=True)
        while True:
            pool.step({slot: "wait" for slot in range(16)})
    time.sleep(600)
'''


# The demo's lanes (app/demo_jobs.py): each lane runs a job that holds an environment pool of its own.
LANES_OWNER = OWNER.split('if __name__ == "__main__":')[0] + '''
from seedfast.app.demo_jobs import run_jobs
from seedfast.config import load_config


def job_with_envs(cfg, name, out):
    pool = EnvPool(4, SlowEnv, processes=1, step_timeout=600)
    pool.reset(["fast"] * 4)
    print(f"job {name} stepping", flush=True)
    while True:
        pool.step({slot: "wait" for slot in range(4)})


if __name__ == "__main__":
    run_jobs(load_config(None, ["demo.lanes=2"]), sys.argv[1], cpus=2, job=job_with_envs)
'''


def marked(marker: bytes) -> list[int]:
    """Live (not zombie) processes whose environment holds `marker`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            zombie = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
            if marker in (proc / "environ").read_bytes() and not zombie:
                found.append(int(proc.name))
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
    return found


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
@pytest.mark.parametrize("state,method", [("starting", "spawn"), ("resetting", "spawn"), ("stepping", "spawn"),
                                          ("stepping", "forkserver")])
def test_owner_death_leaves_no_worker_behind(tmp_path, state, method, sig):
    token = uuid.uuid4().hex
    marker = f"SEEDFAST_OWNER_TEST={token}".encode()
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    env = {**os.environ, "SEEDFAST_OWNER_TEST": token, "SLOW_MAIN_IMPORT": "1" if state == "starting" else ""}
    owner = subprocess.Popen([sys.executable, str(script), state, method], env=env, stdout=subprocess.PIPE, text=True)
    try:
        if state == "starting":  # the owner, its resource tracker and both workers exist; no worker serves yet
            wait_for(lambda: len(marked(marker)) >= 4, 60, "the owner's workers")
        else:
            wait_for(lambda: owner.stdout.readline().strip() == state, 60, f"the owner to be {state}")
            time.sleep(0.5)
        started = marked(marker)
        assert owner.pid in started and len(started) >= 3  # the owner, its 2 workers (and helpers it started)
        t0 = time.monotonic()
        owner.send_signal(sig)
        owner.wait(timeout=30)
        wait_for(lambda: not marked(marker), GONE_WITHIN_S, "the owner's processes to exit")
        gone_after = time.monotonic() - t0
        printed = owner.stdout.read()  # the workers shared the owner's stdout: EOF now that they are gone
    finally:
        owner.kill()
        owner.wait()
        for pid in marked(marker):  # a failed test must not leave them either
            os.kill(pid, signal.SIGKILL)
    assert owner.returncode == -sig
    if state == "starting":
        assert "started" not in printed  # killed while the pool was starting
    if state == "resetting":
        assert "reset done" not in printed
    print(f"{state}/{method}/{sig.name}: {len(started) - 1} processes gone {gone_after:.2f}s after the owner")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_the_demo_lanes_and_their_environments_die_with_the_demo(tmp_path, sig):
    token = uuid.uuid4().hex
    marker = f"SEEDFAST_OWNER_TEST={token}".encode()
    script = tmp_path / "lanes_owner.py"
    script.write_text(LANES_OWNER)
    env = {**os.environ, "SEEDFAST_OWNER_TEST": token, "SLOW_MAIN_IMPORT": ""}
    owner = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        stepping = 0
        while stepping < 2:  # both lanes step their environments
            line = owner.stdout.readline()
            assert line, "the owner ended before its lanes stepped"
            stepping += "stepping" in line
        started = marked(marker)
        assert owner.pid in started and len(started) >= 5  # the owner, 2 lanes, a worker each (and helpers)
        owner.send_signal(sig)
        owner.wait(timeout=30)
        wait_for(lambda: not marked(marker), GONE_WITHIN_S, "the lanes and their workers to exit")
    finally:
        owner.kill()
        owner.wait()
        for pid in marked(marker):
            os.kill(pid, signal.SIGKILL)
    assert owner.returncode == -sig
