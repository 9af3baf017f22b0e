import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seedfast.context import (
    Segment,
    build_step_sample,
    fit_teacher_context,
    insertion_index,
    join_segments,
)

# system 0-2, task 3-4, history turns 5-7 / 8-9 / 10-13, observation 14-15, instructions 16-17
PROMPT = [
    Segment("system", [0, 1, 2]),
    Segment("task", [3, 4]),
    Segment("history", [5, 6, 7]),
    Segment("history", [8, 9]),
    Segment("history", [10, 11, 12, 13]),
    Segment("observation", [14, 15]),
    Segment("instructions", [16, 17]),
]


def test_join_is_the_concatenation():
    assert join_segments(PROMPT).tolist() == list(range(18))


@pytest.mark.parametrize("mode, k", [("prepend", 0), ("after_task", 5), ("before_response", 16)])
def test_insertion_points(mode, k):
    assert insertion_index(PROMPT, mode) == k


def test_before_response_without_instructions_is_the_end():
    assert insertion_index(PROMPT[:-1], "before_response") == 16


def test_unknown_mode_and_missing_task():
    with pytest.raises(ValueError, match="allowed: after_task, before_response, prepend"):
        insertion_index(PROMPT, "middle")
    with pytest.raises(ValueError, match="needs a 'task' segment"):
        insertion_index([("system", [1]), ("observation", [2])], "after_task")


def test_segments_out_of_order_or_unknown_kind():
    with pytest.raises(ValueError, match=r"segments\[1\] of kind 'task' comes after"):
        insertion_index([("history", [1]), ("task", [2])], "prepend", sample_id=3)
    with pytest.raises(ValueError, match="kind 'tool'"):
        join_segments([("tool", [1])])


def test_fits_without_truncation():
    fit = fit_teacher_context(PROMPT, ["before_response"], [4], response_length=3, max_length=25)
    assert fit.insert_points == (16,) and fit.dropped_span is None and fit.dropped_turns == 0


@pytest.mark.parametrize(
    "max_length, span, turns",
    [(24, (5, 8), 1), (22, (5, 8), 1), (21, (5, 10), 2), (20, (5, 10), 2), (19, (5, 14), 3), (16, (5, 14), 3)],
)
def test_truncation_drops_whole_turns_from_the_left(max_length, span, turns):
    # teacher input = 18 prompt + 4 privileged + 3 response = 25 tokens; turns are 3, 2, 4 tokens long
    fit = fit_teacher_context(PROMPT, ["after_task"], [4], response_length=3, max_length=max_length)
    assert fit.dropped_span == span and fit.dropped_turns == turns


def test_truncation_that_cannot_fit_names_the_sample():
    # without history: 9 prompt tokens + 4 + 3 = 16 > 11
    with pytest.raises(ValueError, match="sample 'g3/t1/s4'.*16 tokens without any history.*max_length=11"):
        fit_teacher_context(PROMPT, ["prepend"], [4], 3, max_length=11, sample_id="g3/t1/s4")


def test_build_step_sample_keeps_privileged_and_response_whole():
    sample, dropped = build_step_sample(
        PROMPT, [30, 31, 32], skills=[("after_task", [90, 91]), ("before_response", [92, 93])],
        max_length=20, sample_id="s", reward=1.0,
    )
    # 25 tokens, two turns (5 tokens) dropped to reach 20
    assert dropped == 2 and sample.reward == 1.0
    assert sample.prompt_ids.tolist() == list(range(18))  # the student prompt is never cut
    assert sample.teacher_prompt_ids().tolist() == [0, 1, 2, 3, 4, 90, 91, 10, 11, 12, 13, 14, 15, 92, 93, 16, 17]
    assert sample.first_edit() == 5


def test_late_insertion_with_truncation_shares_only_system_and_task():
    sample, dropped = build_step_sample(PROMPT, [30], skills=[("before_response", [90])], max_length=17)
    assert dropped == 1
    assert sample.first_edit() == 5
    assert sample.teacher_prompt_ids().tolist() == [0, 1, 2, 3, 4] + list(range(8, 16)) + [90, 16, 17]


def test_no_skill_means_no_truncation_and_no_teacher():
    sample, dropped = build_step_sample(PROMPT, [30], skills=[], max_length=3)
    assert dropped == 0 and not sample.has_teacher


def test_limit_on_the_prompt_alone():
    sample, dropped = build_step_sample(
        PROMPT, [30, 31, 32], skills=[("prepend", [90])], max_length=19, count_response=False
    )
    assert dropped == 0 and sample.teacher_prompt_ids().tolist() == [90] + list(range(18))


@settings(max_examples=60, deadline=None)
@given(
    system=st.integers(0, 4), task=st.integers(1, 4), turns=st.lists(st.integers(1, 6), max_size=6),
    observation=st.integers(0, 4), tail=st.integers(0, 3), skill=st.integers(1, 5), response=st.integers(1, 5),
    mode=st.sampled_from(["after_task", "before_response", "prepend"]), max_length=st.integers(1, 50),
)
def test_truncation_drops_the_fewest_leftmost_turns(system, task, turns, observation, tail, skill, response,
                                                    mode, max_length):
    segments = [("system", [1] * system), ("task", [2] * task), *[("history", [3] * n) for n in turns],
                ("observation", [4] * observation), ("instructions", [5] * tail)]
    fixed = system + task + observation + tail + skill + response
    if fixed > max_length:
        with pytest.raises(ValueError, match="without any history"):
            build_step_sample(segments, [7] * response, [(mode, [6] * skill)], max_length=max_length)
        return
    sample, dropped = build_step_sample(segments, [7] * response, [(mode, [6] * skill)], max_length=max_length)
    teacher = sample.teacher_prompt_ids().tolist()
    assert len(teacher) + response <= max_length
    assert dropped == next(d for d in range(len(turns) + 1) if fixed + sum(turns[d:]) <= max_length)
    # privileged text, system, task, observation and tail are whole; the kept turns are the rightmost
    assert [teacher.count(v) for v in (1, 2, 4, 5, 6)] == [system, task, observation, tail, skill]
    assert teacher.count(3) == sum(turns[dropped:])
    assert sample.prompt_ids.tolist() == join_segments(segments).tolist()
