"""The analyzer's prompt per world (skills/prompts.py ANALYZER_WORLDS): TextWorld's, byte for byte the prompt every
analyzer and skill-writing example was built from before worlds had their own (data/textworld_analyzer_prompts.json,
written by the code of then), whatever else a trajectory carries; ScienceWorld's (with the real simulator) is in
tests/scienceworld/test_scienceworld_analyzer_prompts.py."""

import json
from pathlib import Path

import pytest

from seedfast.envs.trajectory import record_score
from seedfast.skills.prompts import build_analyzer_messages, score_line
from tests.skills.skills_helpers import trajectory

FIXTURE = Path(__file__).with_name("data") / "textworld_analyzer_prompts.json"
CASES = {
    "won": (dict(actions=["go south", "take passkey"], won=True), {}),
    "lost_invalid": (dict(actions=["go north", "eat passkey"], won=False, valid=[True, False]), {}),
    "error": (dict(actions=["go south"], won=False, error="crash: worker process died"), {}),
    "long_short_shape": (dict(actions=[f"go east {i}" for i in range(12)], won=False),
                         {"max_observation_chars": 10, "max_steps": 6}),
}
MODES = ("episode_only", "episode_step", "step_only")


def case(name, world=None):
    traj, _ = CASES[name]
    t = trajectory(**traj)
    t.meta["scores"] = list(range(len(t.steps)))  # TextWorld's step infos carry a score too: its prompt never shows it
    if world is not None:
        t.meta["world"] = world
    return t


def written():
    return {f"{name}/{mode}": build_analyzer_messages(case(name), mode, **shape)
            for name, (_, shape) in CASES.items() for mode in MODES}


@pytest.mark.parametrize("world", [None, "textworld", "alfworld"])
def test_textworlds_prompt_is_unchanged_byte_for_byte(world):
    expected = json.loads(FIXTURE.read_text(encoding="utf-8"))
    for key, messages in expected.items():
        name, mode = key.split("/")
        got = build_analyzer_messages(case(name, world), mode, **CASES[name][1])
        assert got == messages, key


def test_the_score_after_each_step_carries_over_steps_without_one():
    t = trajectory([], won=False)
    for action, info in [("look", {"valid": True}), ("go south", {"score": 25}), ("eat", {}),
                         ("take", {"score": 0, "error": "crash: the JVM died"})]:
        t.steps.append(trajectory([action], won=False).steps[0])
        record_score(t, info)
    assert t.meta["scores"] == [None, 25, 25, 25]  # a failed step's 0 is no score
    assert score_line(t.meta["scores"]) == "Score (0-100): 0 at the start; 25 after step 1; final score 25."
    assert score_line(None) == "Score (0-100): not recorded."
    untouched = trajectory(["look"], won=False)
    record_score(untouched, {"valid": True})
    assert "scores" not in untouched.meta  # a world whose infos carry no score


if __name__ == "__main__":  # rewrites the fixture: only when TextWorld's prompt is meant to change
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps(written(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
