"""Env slots count what their environments went through (worker restarts, replays, failures by kind) with the same
keys in a worker pool and in-process, so a rollout reports them as metrics instead of dropping them."""

from seedfast.envs import EnvPool
from seedfast.envs.slots import COUNTER_KEYS, LocalEnvSlots, PoolEnvSlots, counter_delta, counters_of
from tests.envs.fake_envs import CRASH, ProcessBoundEnv


def test_a_crash_in_a_pool_shows_in_the_rollout_metrics():
    slots = PoolEnvSlots(EnvPool(2, ProcessBoundEnv, processes=1, step_timeout=30, reset_timeout=60))
    try:
        slots.reset({0: "a", 1: "b"})
        before = counters_of(slots)
        outcome = slots.step({0: CRASH})[0]
        assert outcome[2] and outcome[3]["error"].startswith("crash:")
        moved = counter_delta(before, counters_of(slots), "rollout/env_")
    finally:
        slots.close()
    # slot 1's replay on the new process ends elsewhere: not restored, and failed_lost once it is stepped again
    assert moved == {"rollout/env_worker_restarts": 1.0, "rollout/env_restored": 0.0, "rollout/env_failed_crash": 1.0,
                     "rollout/env_failed_timeout": 0.0, "rollout/env_failed_exception": 0.0,
                     "rollout/env_failed_lost": 0.0, "rollout/env_failed_simulator_timeout": 0.0,
                     "rollout/env_failed_simulator_crash": 0.0}


class Broken:
    def __init__(self, spec):
        raise OSError(f"no game {spec}")


def test_in_process_slots_count_with_the_same_keys():
    slots = LocalEnvSlots(Broken, 2)
    assert slots.reset({0: "x", 1: "y"}) == {0: "OSError: no game x", 1: "OSError: no game y"}
    assert set(slots.counters()) == set(COUNTER_KEYS)
    assert slots.counters()["failed_exception"] == 2 and slots.counters()["worker_restarts"] == 0
    assert counters_of(object()) == {}  # slots that keep no counters report none
