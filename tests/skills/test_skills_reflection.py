"""GRSD text: reflection prompt and parser, judge score parsing, oracle judge, guidance prompt and validator."""

import pytest

from seedfast.skills import (
    AVOID_HEADING,
    DO_HEADING,
    OracleJudge,
    build_guidance_messages,
    build_judge_messages,
    build_reflection_messages,
    parse_judge_score,
    parse_reflection,
    validate_guidance,
)
from tests.skills.skills_helpers import TASK, trajectory

REFLECTION = ("1. At step 0 I did go north, away from the chamber.\n"
              "2. The objective said to head south first.\n"
              "3. Next time go south, then take passkey.")


def test_reflection_prompt_has_task_outcome_and_turns():
    for won, label in ((True, "SUCCEEDED"), (False, "FAILED")):
        [message] = build_reflection_messages(trajectory(["go north", "look"], won=won))
        text = message["content"]
        assert f"Task: {TASK}" in text and f"Outcome: {label}" in text
        assert "Action: go north" in text and "Action: look" in text
        assert "3 to 5 numbered key points" in text


def test_parse_reflection():
    ok = parse_reflection("Here goes:\n" + REFLECTION.replace("2. The", "2) The") + "\n   (that is all)")
    assert ok.valid and len(ok.points) == 3 and ok.points[2].endswith("take passkey. (that is all)")
    assert ok.text.startswith("1. At step 0")
    assert not parse_reflection("1. Went north and lost.\n2. Should go south.").valid
    four = parse_reflection(REFLECTION + "\n4. One more point here.")
    assert four.valid and len(four.points) == 4
    six = REFLECTION + "".join(f"\n{i}. One more point here." for i in (4, 5, 6))
    assert parse_reflection(six).reason == "expected 3-5 numbered points, found 6"
    skipped = parse_reflection("1. Went north and lost.\n3. Should go south.\n4. Then take it.")
    assert not skipped.valid and "found 1" in skipped.reason
    assert parse_reflection("1. Lost.\n2. Go south first.\n3. Take the passkey.").reason == \
        "a key point has fewer than 3 words"
    with pytest.raises(TypeError):
        parse_reflection(3)


@pytest.mark.parametrize("raw, score", [
    ('{"score": 2}', 2), ('```json\n{"score": 0}\n```', 0), ("Score: 3", 3), ("score = 1 (weak)", 1),
    ("**Score**: 2", 2), ("Score: **3**", 3),
    ('{"score": 3.0}', 3), ('{"score": 2.5}', None), ('{"score": 4}', None), ("Score: -1", None),
    ("I would say good.", None), ('{"score": "high"}', None),
])
def test_parse_judge_score(raw, score):
    assert parse_judge_score(raw) == score


def test_judge_prompt_shows_reflection_and_rubric():
    messages = build_judge_messages(trajectory(["go north"], won=False), REFLECTION)
    text = messages[1]["content"]
    assert "Outcome: FAILED" in text and "Reflection to grade:\n" + REFLECTION in text
    assert "causal accuracy" in text and "outcome consistency" in text and "actionability" in text


def test_oracle_judge_by_hand():
    failure = trajectory(["go north", "look"], won=False)  # walkthrough: go south, take passkey
    success = trajectory(["go south", "take passkey"], won=True)
    judge = OracleJudge()
    decisive_only = "1. The plan was clear enough.\n2. I should go south first.\n3. Keep calm and carry on."
    grounded_only = "1. I did go north at first.\n2. I did look around.\n3. I should read the task."
    win = "1. I read the objective first.\n2. I went where it said.\n3. I did take passkey at the end."
    assert judge.score([failure] * 4, [REFLECTION, decisive_only, grounded_only, "no points"]) == [3, 2, 2, 0]
    assert judge.score([success], [win]) == [3]
    assert judge.score([success], [grounded_only]) == [1]
    with pytest.raises(ValueError, match="2 trajectories but 1"):
        judge.score([failure, success], [REFLECTION])


def test_guidance_prompt_contrasts_the_two_sets():
    [message] = build_guidance_messages(TASK, ["1. Went south."], ["1. Went north.", "1. Looked around."])
    text = message["content"]
    assert "SUCCEEDED:\n(1) 1. Went south." in text and "FAILED:\n(1) 1. Went north.\n\n(2) 1. Looked around." in text
    assert DO_HEADING in text and AVOID_HEADING in text and "3-5 bullets" in text
    with pytest.raises(ValueError, match="one success and one failure"):
        build_guidance_messages(TASK, [], ["1. Went north."])


def guidance(do=3, avoid=3, do_heading=DO_HEADING, avoid_heading=AVOID_HEADING, bullet="-"):
    return "\n".join([do_heading, *(f"{bullet} Do thing {i}." for i in range(do)),
                      avoid_heading, *(f"{bullet} Avoid thing {i}." for i in range(avoid))])


def test_valid_guidance_is_canonicalized():
    raw = "Sure, here you go:\n\n" + guidance(5, 3, bullet="*").replace("\n" + AVOID_HEADING, "\n\n" + AVOID_HEADING)
    result = validate_guidance(raw)
    assert result.valid and result.do == [f"Do thing {i}." for i in range(5)] and len(result.avoid) == 3
    assert result.text == guidance(5, 3)
    numbered = guidance().replace("- Do thing", "1. Do thing")
    assert validate_guidance(numbered).valid


@pytest.mark.parametrize("raw, reason", [
    (guidance(do=2), "has 2 bullets"),
    (guidance(avoid=6), "has 6 bullets"),
    (guidance().replace(AVOID_HEADING, "### Things to avoid"), "unexpected heading"),
    (guidance().replace(DO_HEADING, "## Key points to DO"), "unexpected heading"),
    (guidance() + "\n" + AVOID_HEADING + "\n- again", "appears twice"),
    (AVOID_HEADING + "\n- a\n- b\n- c\n" + DO_HEADING + "\n- a\n- b\n- c", "comes before"),
    ("\n".join(guidance().splitlines()[:4]), "missing section '### Mistakes to AVOID'"),
    ("Just be careful.", "missing section '### Key points to DO'"),
    (guidance().replace("- Do thing 1.", "Remember the fridge."), "not a bullet"),
    (guidance().replace("- Do thing 1.", "- "), "not a bullet"),
])
def test_invalid_guidance(raw, reason):
    result = validate_guidance(raw)
    assert not result.valid and reason in result.reason and result.raw == raw
