"""The analyzer prompt: what it shows of a trajectory and what it asks for."""

import json

import pytest

from seedfast.skills import (
    SkillResult,
    analyzer_sft_messages,
    build_analyzer_messages,
    canonical_answer,
    parse_skill_response,
)
from tests.skills.skills_helpers import TASK, trajectory


def user_text(messages):
    assert [m["role"] for m in messages] == ["system", "user"]
    return messages[1]["content"]


def test_success_prompt_asks_for_a_workflow():
    text = user_text(build_analyzer_messages(trajectory(["go south", "take passkey"], won=True)))
    assert f"Task: {TASK}" in text and "Outcome: SUCCEEDED (2 steps)" in text
    assert "[Step 0] Observation: -= Room 0 =- You see exits.\nAction: go south" in text
    assert "[Step 1]" in text and "Action: take passkey" in text
    assert "workflow" in text and "order of the actions" in text and "avoidance" not in text
    schema = text[text.index('{"episode_summary"'):].split("\n")[0]
    assert set(json.loads(schema)) == {"episode_summary", "episode_skill"}
    assert "step_skills" not in text


def test_failure_prompt_asks_for_avoidance_rules_and_marks_invalid_actions():
    traj = trajectory(["dance", "go north"], won=False, valid=[False, True], error="crash: worker died")
    text = user_text(build_analyzer_messages(traj))
    assert "Outcome: FAILED (2 steps, 1 invalid actions)" in text
    assert "Action: dance  (invalid: not an admissible action)" in text
    assert "Action: go north\n" in text
    assert "avoidance rules" in text and "core mistake" in text and "warning signs" in text
    assert "environment error: crash: worker died" in text


@pytest.mark.parametrize("mode, word", [("episode_step", "may"), ("step_only", "must")])
def test_step_modes_ask_for_step_skills(mode, word):
    text = user_text(build_analyzer_messages(trajectory(["go south"], won=False), skill_mode=mode))
    assert f'You {word} add "step_skills"' in text and "0-based step index" in text and "at most 5" in text


def test_long_trajectories_keep_first_and_last_steps_with_their_numbers():
    traj = trajectory([f"go {i}" for i in range(40)], won=False, valid=[True] * 40)
    text = user_text(build_analyzer_messages(traj, max_steps=6, max_observation_chars=10))
    assert "[Step 2]" in text and "[Step 3]" not in text and "[Step 36]" not in text and "[Step 37]" in text
    assert "[... steps 3-36 omitted ...]" in text and "[Step 39]" in text
    assert "Observation: -= Room..." in text  # clipped to 10 characters


def test_sft_conversation_round_trips():
    traj = trajectory(["go south", "take passkey"], won=True)
    result = SkillResult(skill="Go where the objective says, then take the object.", step_skills={1: "Take it now."},
                         valid=True, summary="Solved in two steps.")
    messages = analyzer_sft_messages(traj, result, skill_mode="episode_step")
    assert messages[:2] == build_analyzer_messages(traj, "episode_step")
    assert messages[2]["role"] == "assistant" and messages[2]["content"] == canonical_answer(result)
    again = parse_skill_response(messages[2]["content"], task=traj.task, n_steps=2, skill_mode="episode_step")
    assert (again.skill, again.step_skills, again.summary) == (result.skill, result.step_skills, result.summary)
    with pytest.raises(ValueError, match="valid"):
        analyzer_sft_messages(traj, SkillResult(skill=None, reason="empty"))


def test_bad_arguments():
    with pytest.raises(TypeError, match="Trajectory"):
        build_analyzer_messages({"task": TASK})
    with pytest.raises(ValueError, match="skill_mode"):
        build_analyzer_messages(trajectory([], won=False), skill_mode="all")
