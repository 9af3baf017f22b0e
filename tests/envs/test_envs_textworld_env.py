"""TextWorldEnv on real generated games: walkthroughs win, non-admissible actions are invalid and inert."""

import json
import random

import pytest

from seedfast.envs import Environment, Observation, Trajectory, TrajectoryStep
from seedfast.envs.textworld_env import INVALID_ACTION_TEXT, TextWorldEnv, clean_feedback


def play(env, actions):
    """Reset, then step through `actions` until done; returns (first observation, [(obs, r, done, info)])."""
    first = env.reset()
    out = []
    for action in actions:
        out.append(env.step(action))
        if out[-1][2]:
            break
    return first, out


def test_walkthrough_wins_every_generated_game(all_games):
    assert len(all_games) == 5
    for record in all_games:
        env = TextWorldEnv(record.path)
        assert isinstance(env, Environment)
        assert env.walkthrough == record.walkthrough
        first, steps = play(env, record.walkthrough)
        env.close()
        assert first.task == record.objective and first.task
        assert len(steps) == len(record.walkthrough), record.id
        rewards = [r for _, r, _, _ in steps]
        assert rewards == [0.0] * (len(steps) - 1) + [1.0], record.id
        last_info = steps[-1][3]
        assert steps[-1][2] and last_info["won"] and not last_info["lost"]
        assert all(info["valid"] for _, _, _, info in steps)


def test_first_observation_is_clean_text(games):
    record = games["treasure_hunter"][0]
    env = TextWorldEnv(record.path)
    obs = env.reset()
    env.close()
    assert isinstance(obs, Observation)
    assert "$$" not in obs.text and "-= " in obs.text  # banner gone, room header kept
    assert record.objective not in obs.text  # the task is its own field
    assert not obs.text.rstrip().endswith(">")
    assert record.walkthrough[0] in obs.admissible_actions


def test_nonsense_command_is_invalid_and_leaves_the_game_untouched(games):
    record = games["treasure_hunter"][0]
    env = TextWorldEnv(record.path)
    first = env.reset()
    for nonsense in ("dance wildly", "", "go south. take passkey", "xyzzy " * 50):
        obs, reward, done, info = env.step(nonsense)
        assert (reward, done, info["valid"], info["won"]) == (0.0, False, False, False)
        assert obs.text == INVALID_ACTION_TEXT
        assert obs.admissible_actions == first.admissible_actions
    # The game never saw those commands: the walkthrough still wins in exactly its own length.
    steps = [env.step(action) for action in record.walkthrough]
    env.close()
    assert steps[-1][1] == 1.0 and steps[-1][2]


def test_admissible_matching_ignores_case_and_spacing(games):
    record = games["treasure_hunter"][0]
    env = TextWorldEnv(record.path)
    env.reset()
    shouted = "  " + "   ".join(record.walkthrough[0].upper().split()) + " "
    _, _, _, info = env.step(shouted)
    env.close()
    assert info["valid"]


def test_random_policy_counts_invalid_actions(games):
    """Each chosen action is valid exactly when it was admissible before the step; n_invalid counts the rest."""
    record = games["treasure_hunter"][1]
    env = TextWorldEnv(record.path)
    rng = random.Random(0)
    obs = env.reset()
    trajectory = Trajectory(task=obs.task, game_id=env.game_id, walkthrough=record.walkthrough)
    expected_invalid = 0
    for _ in range(12):
        if rng.random() < 0.5:
            action = rng.choice(obs.admissible_actions)
        else:
            action = rng.choice(["fly north", "eat the door", "take", "open sesame"])
        admissible = [a.lower() for a in obs.admissible_actions]
        expected_invalid += action.lower() not in admissible
        next_obs, reward, done, info = env.step(action)
        assert info["valid"] == (action.lower() in admissible)
        trajectory.steps.append(TrajectoryStep(obs.text, obs.admissible_actions, action, valid=info["valid"],
                                               reward=reward))
        obs = next_obs
        if done:
            trajectory.won = info["won"]
            break
    env.close()
    assert expected_invalid > 0
    assert trajectory.n_invalid == expected_invalid
    restored = Trajectory.from_dict(json.loads(json.dumps(trajectory.to_dict())))
    assert restored == trajectory and restored.n_invalid == expected_invalid


def test_misuse_raises_clear_errors(games, tmp_path):
    record = games["coin_collector"][0]
    env = TextWorldEnv(record.path)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("look")
    env.reset()
    with pytest.raises(TypeError, match="action"):
        env.step(None)
    for action in record.walkthrough:
        env.step(action)
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("look")
    assert env.reset().task == record.objective  # a new episode after the end
    env.close()
    with pytest.raises(FileNotFoundError, match="game_path"):
        TextWorldEnv(tmp_path / "missing.z8")
    (tmp_path / "notes.txt").write_text("not a game")
    with pytest.raises(ValueError, match="game_path"):
        TextWorldEnv(tmp_path / "notes.txt")
    with pytest.raises(TypeError, match="game_path"):
        TextWorldEnv(3)


def test_clean_feedback_strips_banner_status_and_prompt():
    raw = ("\n\n   ________  ____\n  |        \\|    \\\n   \\$$$$$$$$| $$$$\n\nGo find the key.\n\n"
           "-= Attic =-\nDusty.   \n\n\n\n>                  -= Attic =-0/3")
    assert clean_feedback(raw, objective="Go find the key.") == "-= Attic =-\nDusty."
    end = ("You win.\n\n*** The End ***\n\n"
           "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?\n>")
    assert clean_feedback(end) == "You win.\n\n*** The End ***"
