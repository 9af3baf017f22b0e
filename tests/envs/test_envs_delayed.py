"""env.step_delay_s (envs/delayed.py): every step of the game takes the delay on top of its own, reset does not, the
game's answers pass through unchanged, and the factory pickles (worker processes build it) and is what
make_env_slots builds when the key is set."""

import pickle
import time

from seedfast.config import load_config
from seedfast.envs.delayed import DelayedEnv, DelayedFactory
from seedfast.runtime.setup import make_env_slots
from tests.envs.fake_envs import ProcessBoundEnv


def test_steps_take_the_delay_and_answers_pass_through():
    factory = pickle.loads(pickle.dumps(DelayedFactory(ProcessBoundEnv, 0.05)))
    env = factory("game")
    plain = ProcessBoundEnv("game")
    assert isinstance(env, DelayedEnv) and env.spec == "game"  # the game's own attributes too
    t = time.perf_counter()
    assert env.reset() == plain.reset()
    assert time.perf_counter() - t < 0.05
    t = time.perf_counter()
    for _ in range(3):
        assert env.step("wait") == plain.step("wait")
    assert time.perf_counter() - t >= 0.15


def test_make_env_slots_wraps_the_game_when_the_key_is_set():
    slots = make_env_slots(load_config(None, ["env.isolation=inline", "env.step_delay_s=0.25"]), 2)
    assert slots._make_env == DelayedFactory(slots._make_env.factory, 0.25)
    assert not isinstance(make_env_slots(load_config(None, ["env.isolation=inline"]), 2)._make_env, DelayedFactory)
