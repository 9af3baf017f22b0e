"""EnvPool: parallel episodes in worker processes; crashed, hung and failing environments are recovered."""

import os
import signal
import time

import pytest

from seedfast.envs import EnvPool, Transition
from seedfast.envs.textworld_env import TextWorldEnv

STEP_TIMEOUT = 3.0


@pytest.fixture(scope="module")
def pool():
    with EnvPool(n_workers=2, step_timeout=STEP_TIMEOUT, reset_timeout=60.0) as env_pool:
        yield env_pool


def run_walkthrough(pool, slot, record):
    """Reset `slot` on `record` and play its walkthrough; returns the transitions."""
    out = [pool.reset({slot: record.path})[slot]]
    for action in record.walkthrough:
        out.append(pool.step({slot: action})[slot])
    return out


def test_pool_plays_like_the_in_process_environment(pool, games):
    records = games["treasure_hunter"][:2]
    first = pool.reset([r.path for r in records])
    assert isinstance(first, list) and all(isinstance(t, Transition) and not t.done for t in first)
    for step in range(2):
        out = pool.step([r.walkthrough[step] for r in records])
        assert [t.done for t in out] == [step == 1, step == 1]
    assert [t.reward for t in out] == [1.0, 1.0] and all(t.info["won"] for t in out)
    # Same texts as the environment played in this process.
    local = TextWorldEnv(records[0].path)
    assert local.reset() == first[0].observation
    for action in records[0].walkthrough:
        observation, reward, done, info = local.step(action)
    local.close()
    assert (observation, reward, done) == (out[0].observation, out[0].reward, out[0].done)


@pytest.mark.parametrize("dead_before_send", [False, True])  # the pipe breaks on receive, or already on send
def test_killed_worker_fails_its_trajectory_and_is_replaced(pool, games, dead_before_send):
    record = games["treasure_hunter"][0]
    crashes, restarts = pool.failures["crash"], pool.n_restarts
    pool.reset({0: record.path, 1: record.path})
    old_pid = pool.pid(0)
    os.kill(old_pid, signal.SIGKILL)
    if dead_before_send:
        pool._workers[0].process.join(timeout=10)
    out = pool.step({0: record.walkthrough[0], 1: record.walkthrough[0]})
    assert out[0].done and out[0].reward == 0.0 and not out[0].info["won"]
    assert out[0].info["error"].startswith("crash:") and "-9" in out[0].info["error"]
    assert out[0].info["valid"]  # the action was admissible: the crash is not the policy's fault
    assert not out[1].done and "error" not in out[1].info  # the other slot plays on
    assert pool.failures["crash"] == crashes + 1 and pool.n_restarts == restarts + 1
    assert pool.pid(0) != old_pid
    with pytest.raises(RuntimeError, match="reset"):
        pool.step({0: "look"})  # its episode is over
    transitions = run_walkthrough(pool, 0, record)
    assert transitions[-1].done and transitions[-1].info["won"]


def test_hung_worker_times_out_and_is_replaced(pool, games):
    record = games["treasure_hunter"][1]
    timeouts = pool.failures["timeout"]
    pool.reset({1: record.path})
    old_pid = pool.pid(1)
    os.kill(old_pid, signal.SIGSTOP)  # the worker stops answering
    start = time.monotonic()
    out = pool.step({1: record.walkthrough[0]})[1]
    waited = time.monotonic() - start
    assert out.done and out.info["error"].startswith("timeout:")
    assert STEP_TIMEOUT <= waited < STEP_TIMEOUT + 30  # bounded wait (generous margin for a loaded machine)
    assert pool.failures["timeout"] == timeouts + 1 and pool.pid(1) != old_pid
    assert run_walkthrough(pool, 1, record)[-1].info["won"]


def test_environment_exception_fails_the_episode_without_a_restart(pool, games, tmp_path):
    exceptions, restarts = pool.failures["exception"], pool.n_restarts
    pid = pool.pid(0)
    out = pool.reset({0: str(tmp_path / "missing.z8")})[0]
    assert out.done and "FileNotFoundError" in out.info["error"] and "game_path" in out.info["error"]
    assert pool.failures["exception"] == exceptions + 1
    assert pool.n_restarts == restarts and pool.pid(0) == pid
    assert run_walkthrough(pool, 0, games["coin_collector"][0])[-1].info["won"]


def test_bad_calls_raise_before_reaching_a_worker(pool, games):
    path = games["coin_collector"][0].path
    with pytest.raises(ValueError, match="slot"):
        pool.reset({2: path})
    with pytest.raises(ValueError, match="3 slots"):
        pool.reset([path, path, path])
    with pytest.raises(TypeError, match="specs"):
        pool.reset(path)
    pool.reset({0: path})
    with pytest.raises(TypeError, match=r"actions\[0\]"):
        pool.step({0: 7})


def test_close_ends_every_worker(games):
    with EnvPool(n_workers=2, step_timeout=STEP_TIMEOUT) as env_pool:
        env_pool.reset([games["coin_collector"][0].path] * 2)
        pids = [env_pool.pid(0), env_pool.pid(1)]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(RuntimeError, match="closed"):
        env_pool.reset([games["coin_collector"][0].path])


def test_constructor_validates():
    with pytest.raises(ValueError, match="n_workers"):
        EnvPool(0)
    with pytest.raises(ValueError, match="step_timeout"):
        EnvPool(1, step_timeout=0)
