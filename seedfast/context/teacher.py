"""The teacher context of one step: where each skill goes, which history survives truncation, and the StepSample
the scorer reads (docs/algorithms.md, 'Teacher context and insertion points' and 'SEED').

    pairs = place_skills(insert_points(segments), "after_task", episode_ids, step_ids, "additive")
    sample, dropped = build_step_sample(segments, response_ids, pairs, max_length=limit)

Config-free: every choice (insertion mode, teacher mode, length limit) is an argument.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from seedfast.context.sample import StepSample, TokenIds, as_token_tensor
from seedfast.context.segments import Segment, check_segments, join_segments, point_at, segment_bounds, who

LATE = "before_response"  # step skills always go late (docs/algorithms.md, 'SEED')
TEACHER_MODES = ("step_priority", "additive")

Ids = TypeVar("Ids")


def place_skills(points: Mapping[str, int], insertion: str, episode: Ids | None, step: Ids | None,
                 teacher_mode: str) -> list[tuple[str, Ids]]:
    """The (insertion mode, privileged ids) pairs of one step, in the order of their insertion points.

    `points` are the step's insert_points; the episode skill goes at `insertion`, a step skill at LATE;
    `step_priority` keeps only the step skill when there is one, `additive` keeps both.
    """
    if teacher_mode not in TEACHER_MODES:
        raise ValueError(f"teacher_mode {teacher_mode!r} is not one of {list(TEACHER_MODES)}")
    if step is not None and teacher_mode == "step_priority":
        return [(LATE, step)]
    pairs: list[tuple[str, Ids]] = []
    if episode is not None:
        pairs.append((insertion, episode))
    if step is not None:
        pairs.append((LATE, step))
    # insertion points must not decrease: order by where each mode lands (stable for equal points)
    return sorted(pairs, key=lambda p: points[p[0]])


@dataclass(frozen=True)
class TeacherFit:
    """Where the privileged text goes and which history the teacher context leaves out."""

    insert_points: tuple[int, ...]  # one per privileged piece, in prompt coordinates
    dropped_span: tuple[int, int] | None  # prompt tokens [start, end) absent from the teacher context
    dropped_turns: int  # history segments dropped (the truncation metric)


def fit_teacher_context(
    segments: Sequence[Segment | tuple],
    modes: Sequence[str],
    privileged_lengths: Sequence[int],
    response_length: int,
    max_length: int | float,
    sample_id: Hashable | None = None,
) -> TeacherFit:
    """Insertion points for each privileged piece, and the truncation rule (docs/algorithms.md, 'Teacher context and
    insertion points').

    The teacher input is P with the privileged pieces inserted, followed by A. While its length exceeds
    `max_length`, whole history turns are dropped from the left of the history window (never the
    privileged text, the response, system or task). If dropping all history is not enough, raise.
    Pass `response_length=0` when the limit applies to the teacher prompt alone.
    """
    checked = check_segments(segments, sample_id)
    if len(modes) != len(privileged_lengths):
        raise ValueError("modes and privileged_lengths must have the same length")
    bounds = segment_bounds(checked)
    points = tuple(point_at(bounds, mode, sample_id) for mode in modes)
    if any(b < a for a, b in zip(points, points[1:])):
        raise ValueError(f"{who(sample_id)}: insertion modes {list(modes)} give decreasing points {points}")
    length = (bounds[-1][2] if bounds else 0) + sum(privileged_lengths) + response_length
    history = [(start, end) for kind, start, end in bounds if kind == "history"]
    dropped = 0
    while length > max_length and dropped < len(history):
        start, end = history[dropped]
        length -= end - start
        dropped += 1
    if length > max_length:
        raise ValueError(
            f"{who(sample_id)}: teacher input is {length} tokens without any history, over max_length="
            f"{max_length} (privileged {sum(privileged_lengths)}, response {response_length}); "
            "the privileged text and the response are never truncated"
        )
    span = (history[0][0], history[dropped - 1][1]) if dropped else None
    return TeacherFit(points, span, dropped)


def build_step_sample(
    segments: Sequence[Segment | tuple],
    response_ids: TokenIds,
    skills: Sequence[tuple[str, TokenIds]] = (),
    *,
    max_length: int | None = None,
    count_response: bool = True,
    sample_id: Hashable | None = None,
    teacher_valid: bool = True,
    **fields,
) -> tuple[StepSample, int]:
    """A StepSample from prompt segments and `(mode, privileged_ids)` skills; returns (sample, dropped_turns).

    `max_length=None` disables truncation. `fields` go to StepSample (reward, group_id, meta).
    """
    checked = check_segments(segments, sample_id)
    response = as_token_tensor(response_ids, f"{who(sample_id)}: response_ids")
    pieces = [(mode, as_token_tensor(ids, f"{who(sample_id)}: skill {mode!r}")) for mode, ids in skills]
    modes = [mode for mode, _ in pieces]
    lengths = [len(ids) for _, ids in pieces]
    limit = max_length if (max_length is not None and pieces) else float("inf")
    fit = fit_teacher_context(
        checked, modes, lengths, len(response) if count_response else 0, limit, sample_id
    )
    sample = StepSample(
        prompt_ids=join_segments(checked),
        response_ids=response,
        insertions=[(at, ids) for at, (_, ids) in zip(fit.insert_points, pieces)],
        teacher_drops=[fit.dropped_span] if fit.dropped_span else [],
        sample_id=sample_id,
        teacher_valid=teacher_valid,
        **fields,
    )
    return sample, fit.dropped_turns


@dataclass(frozen=True)
class StepTeacher:
    """A step's sample with the teacher context that fits, and what the fit cost."""

    sample: StepSample
    dropped_turns: int  # history turns the teacher context left out
    too_long: bool  # the skills did not fit even without history: the step has no teacher (leaves OPD)


def fit_step(to_sample: Callable[..., tuple[StepSample, int]], skills: Sequence[tuple[str, TokenIds]],
             max_prompt_length: int, response_length: int) -> StepTeacher:
    """The sample of one step under the truncation rule: the teacher input may be `max_prompt_length` tokens plus
    the response; history goes first, and a step whose skills do not fit even without history keeps no teacher.

    `to_sample(skills, max_length=..., teacher_valid=...)` builds the sample (e.g. StepRecord.to_sample, or
    build_step_sample with the step's segments and response bound).
    """
    try:
        sample, dropped = to_sample(skills, max_length=max_prompt_length + response_length,
                                    teacher_valid=bool(skills))
        return StepTeacher(sample, dropped, False)
    except ValueError:  # the skill does not fit even without history: this step leaves OPD, counted
        sample, dropped = to_sample([], teacher_valid=False)
        return StepTeacher(sample, dropped, True)
