"""The analyzer-answer parser: JSON found wherever models put it; trivial skills rejected with a reason."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seedfast.skills import REASONS, SkillResult, count_reasons, parse_skill_response
from seedfast.skills.parse import skill_problem

TASK = "Your objective is to head south, then pick up the passkey from the floor of the chamber."
SKILL = "Follow the objective's directions in order, then take the named object at once."


def answer(skill=SKILL, summary="It went south and took the passkey.", **extra):
    return json.dumps({"episode_summary": summary, "episode_skill": skill, **extra})


@pytest.mark.parametrize("raw", [
    answer(),
    "```json\n" + answer() + "\n```",
    "Here is my analysis:\n```\n" + answer() + "\n```\nHope this helps!",
    "Sure! " + answer() + " Anything else?",
    "<think>maybe {\"episode_skill\": \"decoy from the reasoning block\"}</think>\n" + answer(),
    answer()[:-1] + ",}",  # trailing comma
    '{"note": "first object has no skill"}\n' + answer(),
    json.dumps(json.loads(answer()), indent=2),
])
def test_finds_the_skill_wherever_it_is(raw):
    result = parse_skill_response(raw, task=TASK)
    assert result == SkillResult(skill=SKILL, valid=True, reason="ok", raw=raw,
                                 summary="It went south and took the passkey.")


def test_braces_inside_strings_do_not_confuse_the_scan():
    skill = "Use {curly} words sparingly; a } or { in text is fine here."
    assert parse_skill_response("x " + answer(skill=skill), task=TASK).skill == skill


def test_whitespace_in_the_skill_is_normalized():
    assert parse_skill_response(answer(skill="  Go   south first,\n then  take it.  ")).skill == \
        "Go south first, then take it."


@pytest.mark.parametrize("raw, reason", [
    ("I think the agent should go south.", "no_json"),
    ('{"episode_skill": "Go south then take it."', "no_json"),  # unterminated
    ("", "no_json"),
    (json.dumps({"episode_summary": "s"}), "missing_key"),
    (json.dumps({"skill": SKILL}), "missing_key"),
    (answer(skill=["go south", "take"]), "wrong_type"),
    (answer(skill=None), "wrong_type"),
    (answer(skill=42), "wrong_type"),
    (answer(skill="   "), "empty"),
    (answer(skill="<the skill>"), "copied_template"),
    (answer(skill="<write your workflow here>"), "copied_template"),
    (answer(skill="Go south."), "too_short"),
    (answer(skill="x" * 10 + " word" * 300), "too_long"),
    (answer(skill=TASK), "echo_task"),
    (answer(skill="Head south, then pick up the passkey."), "echo_task"),
])
def test_rejects_with_the_reason(raw, reason):
    result = parse_skill_response(raw, task=TASK)
    assert (result.valid, result.reason, result.skill, result.raw) == (False, reason, None, raw)
    assert reason in REASONS


def test_echo_needs_the_task():
    assert parse_skill_response(answer(skill=TASK)).valid  # no task given: nothing to compare with


def test_step_skills_are_cleaned():
    steps = {"0": "Go south before anything else.", "1": "Take the passkey now.", "7": "Out of range step.",
             "x": "Not a step index.", "-1": "Negative index here.", "2": 5, "3": "Ok"}
    result = parse_skill_response(answer(step_skills=steps), task=TASK, n_steps=4, skill_mode="episode_step")
    assert result.valid and result.step_skills == {0: "Go south before anything else.", 1: "Take the passkey now."}
    assert result.n_dropped_step_skills == 5


def test_at_most_five_step_skills_lowest_steps_first():
    steps = {str(i): f"Do thing number {i}." for i in (9, 3, 0, 7, 1, 5, 2)}
    result = parse_skill_response(answer(step_skills=steps), n_steps=10, skill_mode="episode_step")
    assert list(result.step_skills) == [0, 1, 2, 3, 5] and result.n_dropped_step_skills == 2


def test_episode_only_ignores_step_skills():
    result = parse_skill_response(answer(step_skills={"0": "Go south first."}), skill_mode="episode_only")
    assert result.valid and result.step_skills == {} and result.n_dropped_step_skills == 0


def test_step_only_mode():
    steps = {"1": "Take the passkey now."}
    ok = parse_skill_response(json.dumps({"step_skills": steps}), n_steps=2, skill_mode="step_only")
    assert ok.valid and ok.skill is None and ok.step_skills == {1: "Take the passkey now."}
    with_bad_episode = parse_skill_response(answer(skill="Go.", step_skills=steps), skill_mode="step_only")
    assert with_bad_episode.valid and with_bad_episode.skill is None
    assert parse_skill_response(answer(), skill_mode="step_only").reason == "no_step_skills"
    assert parse_skill_response(answer(step_skills=["Go south."]), skill_mode="step_only").reason == "wrong_type"
    assert parse_skill_response(answer(step_skills={"5": "Too far away."}), n_steps=2,
                                skill_mode="step_only").reason == "no_step_skills"


def test_episode_step_keeps_a_good_episode_skill_when_step_skills_are_malformed():
    result = parse_skill_response(answer(step_skills="go south"), skill_mode="episode_step")
    assert result.valid and result.step_skills == {} and result.n_dropped_step_skills == 1


def test_bad_arguments():
    with pytest.raises(TypeError, match="raw"):
        parse_skill_response(None)
    with pytest.raises(ValueError, match="skill_mode"):
        parse_skill_response(answer(), skill_mode="steps")
    with pytest.raises(ValueError, match="reason"):
        SkillResult(skill=None, reason="bad")


def test_count_reasons():
    raws = [answer(), answer(skill=""), "nope", answer(skill="Go."), "still nope"]
    counts = count_reasons(parse_skill_response(r) for r in raws)
    assert counts == {"ok": 1, "empty": 1, "no_json": 2, "too_short": 1}


_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="{}`<", exclude_categories=("Cs",)),
                max_size=60)


@settings(max_examples=150, deadline=None)
@given(skill=st.text(min_size=1, max_size=300), before=_text, after=_text)
def test_any_usable_skill_survives_surrounding_text(skill, before, after):
    raw = before + json.dumps({"episode_skill": skill}, ensure_ascii=False) + after
    result = parse_skill_response(raw, task=TASK)
    problem = skill_problem(skill, TASK)
    if problem is None:
        assert result.valid and result.skill == " ".join(skill.split())
    else:
        assert (result.valid, result.reason) == (False, problem)
