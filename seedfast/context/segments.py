"""Prompt segments with known token boundaries, and the insertion points (docs/algorithms.md, 'Teacher context and
insertion points').

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
from typing import NamedTuple

import torch

from seedfast.context.sample import TokenIds, as_token_tensor

KIND_ORDER = {"system": 0, "task": 1, "history": 2, "observation": 3, "instructions": 4}
INSERTION_MODES = ("after_task", "before_response", "prepend")


class Segment(NamedTuple):
    kind: str
    ids: TokenIds


def who(sample_id: Hashable | None) -> str:
    """How errors name a prompt: by its sample id when it has one."""
    return f"sample {sample_id!r}" if sample_id is not None else "prompt"


def check_segments(segments: Sequence[Segment | tuple], sample_id: Hashable | None = None) -> list[Segment]:
    """Segments with ids as 1-D int64 tensors; kinds known and in the documented order."""
    name, out, rank = who(sample_id), [], 0
    for i, piece in enumerate(segments):
        if not isinstance(piece, (tuple, list)) or len(piece) != 2:
            raise TypeError(f"{name}: segments[{i}] must be a (kind, ids) pair")
        kind, ids = piece
        if kind not in KIND_ORDER:
            raise ValueError(f"{name}: segments[{i}] has kind {kind!r}; allowed: {', '.join(KIND_ORDER)}")
        if KIND_ORDER[kind] < rank:
            raise ValueError(
                f"{name}: segments[{i}] of kind {kind!r} comes after a later kind; order: {', '.join(KIND_ORDER)}"
            )
        rank = KIND_ORDER[kind]
        out.append(Segment(kind, as_token_tensor(ids, f"{name}: segments[{i}] ({kind})")))
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


def point_at(bounds: Sequence[tuple[str, int, int]], mode: str, sample_id: Hashable | None = None) -> int:
    """The insertion point `mode` from a prompt's segment_bounds."""
    if mode == "prepend":
        return 0
    if mode == "after_task":
        task_ends = [end for kind, _, end in bounds if kind == "task"]
        if not task_ends:
            raise ValueError(f"{who(sample_id)}: insertion mode 'after_task' needs a 'task' segment")
        return task_ends[-1]
    if mode == "before_response":
        starts = [start for kind, start, _ in bounds if kind == "instructions"]
        return starts[0] if starts else (bounds[-1][2] if bounds else 0)
    raise ValueError(f"insertion mode {mode!r} is unknown; allowed: {', '.join(INSERTION_MODES)}")


def insertion_index(segments: Sequence[Segment | tuple], mode: str, sample_id: Hashable | None = None) -> int:
    """Token index k of the insertion point `mode` in the joined prompt (docs/algorithms.md, 'Teacher context and
    insertion points')."""
    return point_at(segment_bounds(check_segments(segments, sample_id)), mode, sample_id)


def insert_points(segments: Sequence[Segment | tuple], sample_id: Hashable | None = None) -> dict[str, int]:
    """Token index of every insertion mode (after_task, before_response, prepend) in the joined prompt: the one
    implementation behind `Prompt.insert_points` and `StepRecord.insert_points`."""
    bounds = segment_bounds(check_segments(segments, sample_id))
    return {mode: point_at(bounds, mode, sample_id) for mode in INSERTION_MODES}
