"""The teacher context of one step, pinned against hand-computed token indices (docs/algorithms.md, 'Teacher context
and insertion points'): insertion points, skill placement, the truncation rule, the too-long fallback."""

import pytest
import torch

from seedfast.context import (
    LATE,
    SkillIds,
    build_step_sample,
    fit_step,
    fit_teacher_context,
    insert_points,
    place_skills,
    skill_segment,
)
from seedfast.rollout.prompts import Prompt
from seedfast.rollout.records import StepRecord

# system 0-1, task 2-4, history turns 5-6 / 7-9, observation 10, instructions 11-12: 13 tokens
SEGMENTS = (
    ("system", [100, 101]),
    ("task", [102, 103, 104]),
    ("history", [105, 106]),
    ("history", [107, 108, 109]),
    ("observation", [110]),
    ("instructions", [111, 112]),
)
PROMPT = list(range(100, 113))
SKILL = [900, 901]
RESPONSE = [50, 51, 52]  # teacher input without truncation: 13 + 2 + 3 = 18 tokens
POINTS = {"after_task": 5, "before_response": 11, "prepend": 0}


def teacher(mode, kept):
    """The teacher prompt by hand: SKILL at the mode's point, `kept` = the prompt tokens that survive."""
    k = {"prepend": 100, "after_task": 105, "before_response": 111}[mode]
    return [t for t in kept if t < k] + SKILL + [t for t in kept if t >= k]


def test_insert_points_by_hand():
    assert insert_points(SEGMENTS) == POINTS
    assert insert_points(SEGMENTS[:-1])["before_response"] == 11  # no instructions: the end (11 tokens)
    with pytest.raises(ValueError, match="needs a 'task' segment"):
        insert_points([("system", [1]), ("observation", [2])])


def test_prompt_and_record_share_one_insert_points():
    segments = tuple((kind, torch.tensor(ids)) for kind, ids in SEGMENTS)
    record = StepRecord(segments, tuple(RESPONSE), None, 1.0, 0, 0, 2, True, True, "stop")
    assert Prompt(segments, "").insert_points() == record.insert_points() == POINTS


# limit -> (history dropped: span, turns; the prompt tokens the teacher keeps)
CASES = [
    (18, None, 0, PROMPT),
    (17, (5, 7), 1, [100, 101, 102, 103, 104, 107, 108, 109, 110, 111, 112]),
    (16, (5, 7), 1, [100, 101, 102, 103, 104, 107, 108, 109, 110, 111, 112]),
    (15, (5, 10), 2, [100, 101, 102, 103, 104, 110, 111, 112]),
    (13, (5, 10), 2, [100, 101, 102, 103, 104, 110, 111, 112]),
]


@pytest.mark.parametrize("mode", ["after_task", "before_response", "prepend"])
@pytest.mark.parametrize("limit, span, turns, kept", CASES)
def test_truncation_rule_by_hand(mode, limit, span, turns, kept):
    fit = fit_teacher_context(SEGMENTS, [mode], [len(SKILL)], len(RESPONSE), limit)
    assert fit.insert_points == (POINTS[mode],) and fit.dropped_span == span and fit.dropped_turns == turns
    sample, dropped = build_step_sample(SEGMENTS, RESPONSE, [(mode, SKILL)], max_length=limit)
    assert dropped == turns
    assert sample.prompt_ids.tolist() == PROMPT and sample.response_ids.tolist() == RESPONSE
    assert sample.teacher_prompt_ids().tolist() == teacher(mode, kept)
    # shared prefix: up to the insertion point, or to the first dropped turn when that comes first
    assert sample.first_edit() == min(POINTS[mode], span[0] if span else 13)


@pytest.mark.parametrize("mode", ["after_task", "before_response", "prepend"])
def test_no_history_left_to_drop_raises(mode):
    # 8 prompt tokens without history + 2 + 3 = 13 > 12
    with pytest.raises(ValueError, match="13 tokens without any history, over max_length=12"):
        fit_teacher_context(SEGMENTS, [mode], [len(SKILL)], len(RESPONSE), 12)


def test_two_skills_episode_after_task_step_late():
    # 13 + 2 + 1 + 3 = 19 tokens; a limit of 16 drops both turns (19 - 2 = 17 > 16, 17 - 3 = 14)
    sample, dropped = build_step_sample(SEGMENTS, RESPONSE, [("after_task", SKILL), (LATE, [950])], max_length=16)
    assert dropped == 2 and [at for at, _ in sample.insertions] == [5, 11]
    assert sample.teacher_prompt_ids().tolist() == [100, 101, 102, 103, 104, 900, 901, 110, 950, 111, 112]


def test_decreasing_points_are_refused():
    with pytest.raises(ValueError, match="decreasing points"):
        fit_teacher_context(SEGMENTS, [LATE, "after_task"], [1, 1], 0, 100)


@pytest.mark.parametrize(
    "insertion, episode, step, teacher_mode, expected",
    [
        ("after_task", "E", "S", "additive", [("after_task", "E"), (LATE, "S")]),
        ("prepend", "E", "S", "additive", [("prepend", "E"), (LATE, "S")]),
        ("before_response", "E", "S", "additive", [(LATE, "E"), (LATE, "S")]),  # equal points: stable
        ("after_task", "E", "S", "step_priority", [(LATE, "S")]),
        ("after_task", "E", None, "step_priority", [("after_task", "E")]),
        ("prepend", None, "S", "additive", [(LATE, "S")]),
        ("after_task", None, None, "additive", []),
    ],
)
def test_place_skills(insertion, episode, step, teacher_mode, expected):
    assert place_skills(POINTS, insertion, episode, step, teacher_mode) == expected


def test_place_skills_orders_by_point_not_by_kind():
    # a (hypothetical) prompt whose late point came first would put the step skill first
    assert place_skills({"after_task": 9, LATE: 4}, "after_task", "E", "S", "additive") == [(LATE, "S"),
                                                                                           ("after_task", "E")]
    with pytest.raises(ValueError, match="teacher_mode 'both'"):
        place_skills(POINTS, "after_task", "E", None, "both")


def _record():
    return StepRecord(SEGMENTS, tuple(RESPONSE), (-0.5, -0.25, -1.0), 0.75, 3, 1, 2, True, True, "stop", 0.25)


def test_fit_step_truncates_then_falls_back_to_no_teacher():
    record = _record()
    # limit = max_prompt_length + response: 13 + 3 = 16 drops the first turn
    fit = fit_step(record.to_sample, [("after_task", SKILL)], max_prompt_length=13, response_length=3)
    assert (fit.dropped_turns, fit.too_long, fit.sample.has_teacher) == (1, False, True)
    assert fit.sample.teacher_prompt_ids().tolist() == teacher("after_task", CASES[1][3])
    assert fit.sample.sample_id == (1, 2) and fit.sample.reward == 0.75 and fit.sample.penalty == 0.25
    # 9 + 3 = 12 < 13: the skill does not fit even without history; the step keeps its sample, not its teacher
    fit = fit_step(record.to_sample, [("after_task", SKILL)], max_prompt_length=9, response_length=3)
    assert (fit.dropped_turns, fit.too_long, fit.sample.has_teacher) == (0, True, False)
    assert fit.sample.prompt_ids.tolist() == PROMPT and fit.sample.insertions == ()
    # no skill: no teacher, nothing dropped, whatever the limit
    fit = fit_step(record.to_sample, [], max_prompt_length=1, response_length=3)
    assert (fit.dropped_turns, fit.too_long, fit.sample.has_teacher) == (0, False, False)


class CharTokenizer:
    """One token per character (a newline is token 10), counting encode calls."""

    def __init__(self):
        self.calls = 0

    def encode(self, text, add_special_tokens=False):
        self.calls += 1
        return [ord(c) for c in text]


def test_skill_ids_render_once_per_text():
    tok = CharTokenizer()
    ids = SkillIds(tok, max_tokens=8)
    first = ids("go north")
    assert first == skill_segment(CharTokenizer(), "go north", max_tokens=8) == [ord(c) for c in "Skill: "] + [10]
    calls = tok.calls
    assert ids("go north") is first and tok.calls == calls
