"""EnvPool: many environment slots in a few worker processes; crashed, hung and failing environments are recovered,
and the episodes a restarted worker held are rebuilt by replay."""

import os
import signal
import time
from pathlib import Path

import pytest

from seedfast.envs import EnvPool, Transition
from seedfast.envs.textworld_env import TextWorldEnv
from tests.envs.fake_envs import BREAK_IMPORT, CRASH, CrashingEnv, ProcessBoundEnv

STEP_TIMEOUT = 3.0


@pytest.fixture(scope="module")
def pool():
    # slots 0 and 2 in one worker, 1 and 3 in the other
    with EnvPool(4, processes=2, step_timeout=STEP_TIMEOUT, reset_timeout=60.0) as env_pool:
        yield env_pool


def wait_dead(pid, timeout=10.0):
    """Until every thread of `pid` is gone or a zombie (a killed leader is a zombie while its other threads exit)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            states = [(task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                      for task in Path(f"/proc/{pid}/task").iterdir()]
            if all(state == "Z" for state in states):
                return
        except FileNotFoundError:
            if not Path(f"/proc/{pid}").exists():
                return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} still runs")


def run_walkthrough(pool, slot, record):
    """Reset `slot` on `record` and play its walkthrough; returns the transitions."""
    out = [pool.reset({slot: record.path})[slot]]
    for action in record.walkthrough:
        out.append(pool.step({slot: action})[slot])
    return out


def test_slots_share_a_few_processes(pool):
    assert pool.n_slots == 4 and pool.processes == 2 and len(set(pool.pids())) == 2
    assert pool.pid(0) == pool.pid(2) != pool.pid(1) == pool.pid(3)


def test_pool_plays_like_the_in_process_environment(pool, games):
    records = games["treasure_hunter"][:2] * 2
    first = pool.reset([r.path for r in records])
    assert isinstance(first, list) and all(isinstance(t, Transition) and not t.done for t in first)
    for step in range(2):
        out = pool.step([r.walkthrough[step] for r in records])
        assert [t.done for t in out] == [step == 1] * 4
    assert [t.reward for t in out] == [1.0] * 4 and all(t.info["won"] for t in out)
    # Same texts as the environment played in this process.
    local = TextWorldEnv(records[0].path)
    assert local.reset() == first[0].observation
    for action in records[0].walkthrough:
        observation, reward, done, info = local.step(action)
    local.close()
    assert (observation, reward, done) == (out[0].observation, out[0].reward, out[0].done)
    assert out[0] == out[2]  # two slots of one worker keep apart


def test_killed_idle_worker_is_restarted_and_its_episodes_replayed(pool, games):
    records = [games["treasure_hunter"][0], games["coin_collector"][0], games["treasure_hunter"][1]]
    before = pool.counters()
    pool.reset({0: records[0].path, 1: records[1].path, 2: records[2].path})
    pool.step({0: records[0].walkthrough[0], 2: records[2].walkthrough[0]})
    old_pid = pool.pid(0)
    os.kill(old_pid, signal.SIGKILL)
    wait_dead(old_pid)
    # slot 0 moved one step before the kill, slot 2 too; the worker's death was nobody's fault
    out = pool.step({0: records[0].walkthrough[1], 1: records[1].walkthrough[0], 2: "look"})
    assert "error" not in out[0].info and out[0].done and out[0].info["won"]  # the game went on where it was
    assert "error" not in out[1].info and "error" not in out[2].info and not out[2].done
    assert pool.pid(0) != old_pid
    after = pool.counters()
    assert after["worker_restarts"] == before["worker_restarts"] + 1
    assert after["restored"] == before["restored"] + 2
    assert sum(after[k] for k in after if k.startswith("failed_")) == sum(
        before[k] for k in before if k.startswith("failed_"))
    assert pool.step({2: records[2].walkthrough[1]})[2].info["won"]


def test_hung_worker_times_out_its_item_and_the_others_play_on(pool, games):
    record = games["treasure_hunter"][1]
    before = pool.counters()
    pool.reset({1: record.path, 3: record.path})
    old_pid = pool.pid(1)
    os.kill(old_pid, signal.SIGSTOP)  # the worker stops answering
    start = time.monotonic()
    out = pool.step({1: record.walkthrough[0], 3: record.walkthrough[0]})
    waited = time.monotonic() - start
    assert out[1].done and out[1].info["error"].startswith("timeout: no reply to step within 3s")
    assert out[1].info["valid"]  # the action was admissible: the timeout is not the policy's fault
    assert "error" not in out[3].info and not out[3].done  # rebuilt on the new worker, then stepped
    assert STEP_TIMEOUT <= waited < STEP_TIMEOUT + 60  # bounded wait (generous margin for a loaded machine)
    after = pool.counters()
    assert after["failed_timeout"] == before["failed_timeout"] + 1
    assert after["worker_restarts"] == before["worker_restarts"] + 1
    assert after["restored"] == before["restored"] + 1
    assert pool.pid(1) != old_pid
    with pytest.raises(RuntimeError, match="reset"):
        pool.step({1: "look"})  # its episode is over
    assert pool.step({3: record.walkthrough[1]})[3].info["won"]
    assert run_walkthrough(pool, 1, record)[-1].info["won"]


def test_environment_exception_fails_the_episode_without_a_restart(pool, games, tmp_path):
    before = pool.counters()
    pid = pool.pid(0)
    out = pool.reset({0: str(tmp_path / "missing.z8")})[0]
    assert out.done and "FileNotFoundError" in out.info["error"] and "game_path" in out.info["error"]
    after = pool.counters()
    assert after["failed_exception"] == before["failed_exception"] + 1
    assert after["worker_restarts"] == before["worker_restarts"] and pool.pid(0) == pid
    assert run_walkthrough(pool, 0, games["coin_collector"][0])[-1].info["won"]


def test_bad_calls_raise_before_reaching_a_worker(pool, games):
    path = games["coin_collector"][0].path
    with pytest.raises(ValueError, match="slot"):
        pool.reset({4: path})
    with pytest.raises(ValueError, match="5 slots"):
        pool.reset([path] * 5)
    with pytest.raises(TypeError, match="specs"):
        pool.reset(path)
    pool.reset({0: path})
    with pytest.raises(TypeError, match=r"actions\[0\]"):
        pool.step({0: 7})


def test_crash_fails_the_running_item_and_replays_the_others(games):
    records = [games["treasure_hunter"][0], games["treasure_hunter"][1], games["coin_collector"][0],
               games["treasure_hunter"][0]]
    with EnvPool(4, CrashingEnv, processes=1, step_timeout=30, reset_timeout=60) as pool:
        pool.reset([r.path for r in records])
        pool.step([r.walkthrough[0] for r in records])
        old_pid = pool.pid(0)
        out = pool.step({0: "look", 1: "look", 2: CRASH, 3: "look"})  # 0 and 1 answer before 2 kills the worker
        assert out[2].done and out[2].info["error"].startswith("crash: worker process died (exit code -9)")
        assert not out[2].info["valid"]  # CRASH is no admissible action
        assert all("error" not in out[s].info and not out[s].done for s in (0, 1, 3))
        assert pool.pid(0) != old_pid
        assert pool.counters() == {"worker_restarts": 1, "restored": 3, "failed_crash": 1, "failed_timeout": 0,
                                   "failed_exception": 0, "failed_lost": 0, "failed_simulator_timeout": 0,
                                   "failed_simulator_crash": 0}
        # the replayed games are where they were: their last walkthrough action wins
        out = pool.step({s: records[s].walkthrough[1] for s in (0, 1, 3)})
        assert all(out[s].info["won"] for s in (0, 1, 3))


def test_episode_whose_replay_ends_elsewhere_is_lost():
    with EnvPool(3, ProcessBoundEnv, processes=1, step_timeout=30, reset_timeout=60) as pool:
        pool.reset(["a", "b", "c"])
        pool.step({1: "wait"})
        assert pool.step({0: CRASH})[0].info["error"].startswith("crash:")
        # 1 and 2 were replayed on a new process, whose observations differ: their environments are lost
        out = pool.step({1: "wait", 2: "wait"})
        for slot in (1, 2):
            assert out[slot].done and out[slot].info["error"].startswith("lost: could not rebuild")
            assert out[slot].info["valid"]
        assert pool.counters()["failed_lost"] == 2 and pool.counters()["restored"] == 0
        assert "error" not in pool.reset({1: "b"})[1].info  # a new episode starts afresh


def test_worker_that_cannot_start_fails_its_items_and_is_tried_again_later(tmp_path, monkeypatch):
    broken = tmp_path / "broken"
    monkeypatch.setenv(BREAK_IMPORT, str(broken))
    with EnvPool(2, ProcessBoundEnv, processes=1, step_timeout=30, reset_timeout=60) as pool:
        pool.reset(["a", "b"])
        broken.touch()
        old_pid = pool.pid(0)
        os.kill(old_pid, signal.SIGKILL)
        wait_dead(old_pid)
        out = pool.step({0: "wait", 1: "wait"})  # the restarted worker dies importing the factory's module
        for slot in (0, 1):
            assert out[slot].done and out[slot].info["error"].startswith("crash: worker process did not start")
        broken.unlink()
        assert "error" not in pool.reset({0: "a"})[0].info  # the next call starts a worker that works
        assert pool.counters()["worker_restarts"] == 2 and pool.counters()["failed_crash"] == 2


def test_close_ends_every_worker(games):
    with EnvPool(6, processes=2, step_timeout=STEP_TIMEOUT) as env_pool:
        env_pool.reset([games["coin_collector"][0].path] * 6)
        pids = env_pool.pids()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(RuntimeError, match="closed"):
        env_pool.reset([games["coin_collector"][0].path])


def test_constructor_validates():
    with pytest.raises(ValueError, match="n_slots"):
        EnvPool(0)
    with pytest.raises(ValueError, match="processes"):
        EnvPool(2, processes=0)
    with pytest.raises(ValueError, match="step_timeout"):
        EnvPool(1, step_timeout=0)
    with pytest.raises(ValueError, match="fork"):
        EnvPool(1, start_method="fork")
