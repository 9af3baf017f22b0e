"""ScienceWorldEnv against the real jar: reset, step, the gold sequence to score 100, the valid actions, the text."""

import pytest

from seedfast.envs.base import Environment, normalize_action
from seedfast.envs.scienceworld_env import (
    HIDDEN_ACTIONS,
    UNKNOWN_ACTION,
    ScienceWorldEnv,
    Variation,
    resolve_task,
    truncate,
    variations,
)
from tests.scienceworld.helpers import SHORT


@pytest.fixture(scope="module")
def env():
    env = ScienceWorldEnv(SHORT, gold=True, step_limit=50)
    yield env
    env.close()


def test_reset_shows_task_room_inventory_and_valid_actions(env):
    assert isinstance(env, Environment)
    obs = env.reset()
    assert obs.task.startswith("Your task is to use chemistry to create green paint")
    assert "This room is called the hallway" in obs.text and "In your inventory" in obs.text
    assert len(obs.admissible_actions) > 20
    normalized = [normalize_action(a) for a in obs.admissible_actions]
    assert normalized == sorted(set(normalized)), "deduplicated, normalized, sorted"
    assert not set(normalized) & set(HIDDEN_ACTIONS)


def test_gold_sequence_scores_100_and_wins(env):
    obs = env.reset()
    gold = env.walkthrough
    assert gold and 5 <= len(gold) <= 20
    rewards, done, steps = [], False, 0
    for action in gold:
        assert not done
        obs, reward, done, info = env.step(action)
        rewards.append(reward)
        steps += 1
        assert info["valid"], f"gold action {action!r} judged invalid"
        if done:
            break
    assert done and info["won"] and info["score"] == 100 and not info["lost"]
    assert rewards[-1] == 1.0 and set(rewards[:-1]) <= {0.0}, "reward is 1 only at completion"
    assert steps >= len(gold) - 2  # ScienceWorld's gold sequences end with a 'wait1' or so after the win


def test_partial_score_is_kept_in_info_not_in_the_reward(env):
    env.reset()
    scores = []
    for action in env.walkthrough[:6]:
        _, reward, done, info = env.step(action)
        scores.append(info["score"])
        assert reward == 0.0 and not done
    assert 0 < max(scores) < 100


def test_valid_actions_hold_the_gold_action(env):
    obs = env.reset()
    # the first gold move into another room: 'go to <room>' is a listed combination
    action = next(a for a in env.walkthrough if a.startswith("go to"))
    for earlier in env.walkthrough[: env.walkthrough.index(action)]:
        obs, *_ = env.step(earlier)
    assert action in obs.admissible_actions


def test_unknown_and_meta_actions(env):
    env.reset()
    obs, reward, done, info = env.step("dance with the moon")
    assert UNKNOWN_ACTION in obs.text and not info["valid"] and reward == 0.0 and not done
    obs, _, done, info = env.step("reset task")
    assert not info["valid"] and not done


def test_step_limit_ends_the_episode():
    env = ScienceWorldEnv(SHORT, step_limit=2)
    try:
        env.reset()
        assert env.step("look around")[2] is False
        _, reward, done, info = env.step("look around")
        assert done and info["truncated"] and reward == 0.0 and not info["won"]
        with pytest.raises(RuntimeError, match="episode is over"):
            env.step("look around")
    finally:
        env.close()


def test_a_closed_environments_jvm_serves_the_next_one():
    first = ScienceWorldEnv(SHORT)
    first.reset()
    pid = first.pid
    first.close()
    second = ScienceWorldEnv(Variation("lifespan-longest-lived", variations("lifespan-longest-lived", "train")[1],
                                       "easy"))
    try:
        obs = second.reset()
        assert second.pid == pid and second.counters()["simulator_starts"] == 1  # no JVM started: a reload
        assert "longest" in obs.task
    finally:
        second.close()


def test_bad_specs_name_what_is_wrong():
    with pytest.raises(ValueError, match="unknown ScienceWorld task 'boiling'.*boil \\(1-1\\)"):
        resolve_task("boiling")
    assert resolve_task("1-1") == "boil"
    with pytest.raises(ValueError, match="unknown ScienceWorld simplification 'fast'"):
        ScienceWorldEnv(Variation("boil", 0, "fast"))
    with pytest.raises(ValueError, match="variation 30 of 'boil' is not in \\[0, 30\\)"):
        ScienceWorldEnv(Variation("boil", 30))


def test_truncation_keeps_the_head_and_says_so():
    text = "x" * 5000
    cut = truncate(text, 2000)
    assert len(cut) <= 2000 and cut.startswith("x" * 1900) and cut.endswith("more characters cut]")
    assert truncate("short", 2000) == "short"


def test_long_observations_are_cut_to_max_chars():
    env = ScienceWorldEnv(SHORT, max_chars=300)
    try:
        obs = env.reset()
        assert len(obs.text) <= 300 and obs.text.endswith("more characters cut]")
    finally:
        env.close()
