"""The simulator's JVM: bounded heap, dies with its owner whatever killed it, a hung or crashed step is timed out,
counted and survived (the episode fails, the next reset starts a fresh JVM)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seedfast.envs.scienceworld_env import HEAP_MB, ScienceWorldEnv
from seedfast.envs.slots import counter_delta, counters_of
from tests.scienceworld.helpers import SHORT, gone, process_state

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

GONE_WITHIN_S = 5.0

OWNER = '''
import sys
from seedfast.envs.scienceworld_env import ScienceWorldEnv, Variation
from seedfast.envs.workers import EnvPool
from seedfast.envs.scienceworld_env import ScienceWorldFactory

if __name__ == "__main__":
    spec = Variation("chemistry-mix-paint-secondary-color", 0, "easy")
    if sys.argv[1] == "direct":
        env = ScienceWorldEnv(spec)
        env.reset()
        print(env.pid, flush=True)
    else:
        pool = EnvPool(1, ScienceWorldFactory(), processes=1, step_timeout=60, reset_timeout=120)
        pool.reset([spec])
        print(pool.pid(0), flush=True)
    import time
    time.sleep(600)
'''


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _java_under(pid: int) -> list[int]:
    """The java processes among `pid`'s descendants."""
    found, todo = [], [pid]
    while todo:
        for child in _children(todo.pop()):
            todo.append(child)
            try:
                if Path(f"/proc/{child}/comm").read_text().strip() == "java":
                    found.append(child)
            except OSError:
                pass
    return found


def _wait_gone(pids: list[int], within: float) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and not all(gone(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if not gone(p)]


@pytest.mark.parametrize("how", ["direct", "pool"])
def test_the_jvm_dies_when_its_owner_is_sigkilled(tmp_path, how):
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    owner = subprocess.Popen([sys.executable, str(script), how], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[2])
    try:
        line = owner.stdout.readline()
        assert line.strip().isdigit(), f"the owner did not start its simulator (exit code {owner.poll()})"
        jvms = _java_under(owner.pid)
        assert jvms, "no JVM under the owner"
        for jvm in jvms:  # the bound heap
            assert f"-Xmx{HEAP_MB}m" in Path(f"/proc/{jvm}/cmdline").read_text().split("\0")
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        left = _wait_gone(jvms, GONE_WITHIN_S)
        assert not left, f"JVMs {left} outlived their owner by {GONE_WITHIN_S}s"
    finally:
        if owner.poll() is None:
            owner.kill()
        owner.stdout.close()


def test_a_hung_step_times_out_is_counted_and_survived():
    env = ScienceWorldEnv(SHORT, call_timeout_s=2.0)
    try:
        env.reset()
        hung = env.pid
        os.kill(hung, signal.SIGSTOP)  # the simulator stops answering, as a JVM stuck in a loop or a GC would
        started = time.monotonic()
        obs, reward, done, info = env.step("look around")
        assert time.monotonic() - started < 8
        assert done and reward == 0.0 and not info["won"] and info["error"].startswith("timeout:")
        assert info["simulator_timeouts"] == 1 and env.counters()["simulator_timeouts"] == 1
        assert not _wait_gone([hung], GONE_WITHIN_S), "the hung JVM was not killed"
        obs = env.reset()  # a fresh JVM, the same episode start
        assert env.pid != hung and "This room is called the hallway" in obs.text
        assert env.step("look around")[3]["valid"] and env.counters()["simulator_starts"] == 2
    finally:
        if process_state(hung) == "T":
            os.kill(hung, signal.SIGKILL)
        env.close()


def test_a_crashed_jvm_fails_the_episode_and_the_next_reset_restarts():
    env = ScienceWorldEnv(SHORT)
    try:
        env.reset()
        crashed = env.pid
        os.kill(crashed, signal.SIGKILL)
        assert not _wait_gone([crashed], GONE_WITHIN_S)
        _, reward, done, info = env.step("look around")
        assert done and reward == 0.0 and info["error"].startswith("crash:") and info["simulator_crashes"] == 1
        env.reset()
        assert env.pid != crashed and env.step("look around")[3]["valid"]
    finally:
        env.close()


def test_a_hung_step_in_the_trainers_worker_pool_is_survived(tmp_path):
    from seedfast.config import load_config
    from seedfast.runtime.setup import load_tasks, make_env_slots

    cfg = load_config(None, ["env.kind=scienceworld", "env.scienceworld.tasks=[chemistry-mix-paint-secondary-color]",
                             f"env.games_dir={tmp_path}", "env.n_train=1", "env.isolation=process",
                             "env.scienceworld.call_timeout_s=2", "env.step_timeout_s=20"])
    (task,) = load_tasks(cfg, "train")
    envs = make_env_slots(cfg, 1)
    try:
        assert not isinstance(envs.reset({0: task.spec})[0], str)
        (hung,) = _java_under(envs.pool.pid(0))
        before = envs.counters()
        os.kill(hung, signal.SIGSTOP)
        _, reward, done, info = envs.step({0: "look around"})[0]
        assert done and reward == 0.0 and info["error"].startswith("timeout:") and info["simulator_timeouts"] == 1
        # the environment failed the episode itself: its worker was not killed, and the next episode plays
        assert envs.counters()["worker_restarts"] == 0 and envs.counters()["failed_timeout"] == 0
        # and the pool counts it by kind, in the counters the trainer logs as rollout/env_*
        assert counter_delta(before, envs.counters(), "rollout/env_")["rollout/env_failed_simulator_timeout"] == 1
        assert envs.failed_games == {str(task.spec): 1}
        assert not _wait_gone([hung], GONE_WITHIN_S)
        obs = envs.reset({0: task.spec})[0]
        assert not isinstance(obs, str) and "hallway" in obs.text
    finally:
        envs.close()


@pytest.mark.parametrize("isolation", ["process", "inline"])
def test_a_crashed_jvm_is_counted_by_the_trainers_slots(tmp_path, isolation):
    from seedfast.config import load_config
    from seedfast.runtime.setup import load_tasks, make_env_slots

    cfg = load_config(None, ["env.kind=scienceworld", "env.scienceworld.tasks=[chemistry-mix-paint-secondary-color]",
                             f"env.games_dir={tmp_path}", "env.n_train=1", f"env.isolation={isolation}"])
    (task,) = load_tasks(cfg, "train")
    envs = make_env_slots(cfg, 1)
    try:
        assert not isinstance(envs.reset({0: task.spec})[0], str)
        # in this process, idle JVMs of earlier tests may live beside the slot's: ask the slot's environment
        (jvm,) = _java_under(envs.pool.pid(0)) if isolation == "process" else (envs._envs[0][1].pid,)
        before = counters_of(envs)
        os.kill(jvm, signal.SIGKILL)
        assert not _wait_gone([jvm], GONE_WITHIN_S)
        _, _, done, info = envs.step({0: "look around"})[0]
        assert done and info["error"].startswith("crash:")
        moved = counter_delta(before, counters_of(envs), "rollout/env_")
        assert moved["rollout/env_failed_simulator_crash"] == 1 and moved["rollout/env_failed_simulator_timeout"] == 0
        assert moved["rollout/env_failed_crash"] == 0 and moved["rollout/env_worker_restarts"] == 0
    finally:
        envs.close()


@pytest.mark.parametrize("isolation", ["process", "inline"])
def test_a_reset_whose_jvm_does_not_start_in_time_is_counted_by_kind(isolation):
    from seedfast.envs.scienceworld_env import ScienceWorldFactory, close_idle
    from seedfast.envs.slots import LocalEnvSlots, PoolEnvSlots
    from seedfast.envs.workers import EnvPool

    close_idle()  # no idle JVM of an earlier test to reuse: this reset must start one
    factory = ScienceWorldFactory(load_timeout_s=0.2)  # a JVM starts and loads a task in seconds
    envs = (PoolEnvSlots(EnvPool(1, factory, processes=1, step_timeout=30, reset_timeout=60))
            if isolation == "process" else LocalEnvSlots(factory, 1))
    try:
        before = counters_of(envs)
        failed = envs.reset({0: SHORT})[0]
        assert isinstance(failed, str) and "SimulatorFailure: timeout: " in failed
        moved = counter_delta(before, counters_of(envs), "rollout/env_")
        assert moved["rollout/env_failed_simulator_timeout"] == 1 and moved["rollout/env_failed_exception"] == 0
        assert envs.failed_games == {str(SHORT): 1}
    finally:
        envs.close()
