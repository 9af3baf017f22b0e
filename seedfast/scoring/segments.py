"""Prompt segments with known token boundaries: insertion points and the truncation rule (docs/algorithms.md,
'Teacher context and insertion points').

Dependency-free (torch only) so that rollout can build prompts as `list[Segment]` and hand them here.
A prompt is a list of `(kind, ids)` pieces in this order (each kind may be absent or repeat):

    system        system message and chat-template glue before the task
    task          the task line(s)
    history       one (observation, action) turn of the history window per segment
    observation   the current observation (and admissible actions, if the prompt lists them there)
    instructions  the "now it's your turn" tail, ending with the assistant turn opening

Insertion points: `prepend` = 0, `after_task` = end of the last task segment (the shared prefix is
system + task), `before_response` = start of the first instructions segment, or the end of the prompt
when there is none (everything before it is shared).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from seedfast.scoring.sample import StepSample, TokenIds, as_token_tensor

KIND_ORDER = {"system": 0, "task": 1, "history": 2, "observation": 3, "instructions": 4}
INSERTION_MODES = ("after_task", "before_response", "prepend")


class Segment(NamedTuple):
    kind: str
    ids: TokenIds


def _who(sample_id: Hashable | None) -> str:
    return f"sample {sample_id!r}" if sample_id is not None else "prompt"


def check_segments(segments: Sequence[Segment | tuple], sample_id: Hashable | None = None) -> list[Segment]:
    """Segments with ids as 1-D int64 tensors; kinds known and in the documented order."""
    who, out, rank = _who(sample_id), [], 0
    for i, piece in enumerate(segments):
        if not isinstance(piece, (tuple, list)) or len(piece) != 2:
            raise TypeError(f"{who}: segments[{i}] must be a (kind, ids) pair")
        kind, ids = piece
        if kind not in KIND_ORDER:
            raise ValueError(f"{who}: segments[{i}] has kind {kind!r}; allowed: {', '.join(KIND_ORDER)}")
        if KIND_ORDER[kind] < rank:
            raise ValueError(
                f"{who}: segments[{i}] of kind {kind!r} comes after a later kind; order: {', '.join(KIND_ORDER)}"
            )
        rank = KIND_ORDER[kind]
        out.append(Segment(kind, as_token_tensor(ids, f"{who}: segments[{i}] ({kind})")))
    return out


def segment_bounds(segments: Sequence[Segment]) -> list[tuple[str, int, int]]:
    """(kind, start, end) token range of every segment in the joined prompt."""
    bounds, position = [], 0
    for kind, ids in segments:
        bounds.append((kind, position, position + len(ids)))
        position += len(ids)
    return bounds


def join_segments(segments: Sequence[Segment | tuple]) -> torch.Tensor:
    """The prompt token ids: all segments concatenated."""
    checked = check_segments(segments)
    return torch.cat([ids for _, ids in checked]) if checked else torch.zeros(0, dtype=torch.long)


def insertion_index(segments: Sequence[Segment | tuple], mode: str, sample_id: Hashable | None = None) -> int:
    """Token index k of the insertion point `mode` in the joined prompt (docs/algorithms.md, 'Teacher context and
    insertion points')."""
    bounds = segment_bounds(check_segments(segments, sample_id))
    if mode == "prepend":
        return 0
    if mode == "after_task":
        task_ends = [end for kind, _, end in bounds if kind == "task"]
        if not task_ends:
            raise ValueError(f"{_who(sample_id)}: insertion mode 'after_task' needs a 'task' segment")
        return task_ends[-1]
    if mode == "before_response":
        starts = [start for kind, start, _ in bounds if kind == "instructions"]
        return starts[0] if starts else (bounds[-1][2] if bounds else 0)
    raise ValueError(f"insertion mode {mode!r} is unknown; allowed: {', '.join(INSERTION_MODES)}")


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
    max_length: int,
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
    points = tuple(insertion_index(checked, mode, sample_id) for mode in modes)
    order = sorted(range(len(points)), key=lambda i: points[i])
    if list(order) != list(range(len(points))):
        raise ValueError(f"{_who(sample_id)}: insertion modes {list(modes)} give decreasing points {points}")
    bounds = segment_bounds(checked)
    length = (bounds[-1][2] if bounds else 0) + sum(privileged_lengths) + response_length
    history = [(start, end) for kind, start, end in bounds if kind == "history"]
    dropped = 0
    while length > max_length and dropped < len(history):
        start, end = history[dropped]
        length -= end - start
        dropped += 1
    if length > max_length:
        raise ValueError(
            f"{_who(sample_id)}: teacher input is {length} tokens without any history, over max_length="
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
    response = as_token_tensor(response_ids, f"{_who(sample_id)}: response_ids")
    pieces = [(mode, as_token_tensor(ids, f"{_who(sample_id)}: skill {mode!r}")) for mode, ids in skills]
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
