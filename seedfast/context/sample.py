"""One training sample per environment step, and the teacher context derived from it (docs/algorithms.md,
'Samples and rewards').

Dependency-free on purpose (torch and dataclasses only): rollout builds these, scoring and train read them.

The student context is `prompt ⊕ response`. The teacher context is the prompt with *splices* applied,
then the response: each insertion `(at, ids)` puts privileged tokens before `prompt[at]`
(`at == len(prompt)` appends), and each dropped span `(start, end)` leaves `prompt[start:end]` out of
the teacher context (history removed by truncation, teacher.fit_teacher_context). Everything before
the first splice is shared by both contexts, which is what the scorer reuses.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

TokenIds = Sequence[int] | torch.Tensor


def as_token_tensor(ids: Any, what: str) -> torch.Tensor:
    """A 1-D int64 CPU tensor from a list of ints or a 1-D integer tensor; `what` names it in errors."""
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1:
            raise ValueError(f"{what} must be 1-D, got shape {tuple(ids.shape)}")
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise TypeError(f"{what} must hold integer token ids, got dtype {ids.dtype}")
        out = ids.detach().to(device="cpu", dtype=torch.long)
    else:
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
            raise TypeError(f"{what} must be a sequence of ints or a 1-D tensor, got {type(ids).__name__}")
        if any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
            raise TypeError(f"{what} must hold ints only")
        out = torch.tensor(list(ids), dtype=torch.long)
    if out.numel() and int(out.min()) < 0:
        raise ValueError(f"{what} holds a negative token id ({int(out.min())})")
    return out


@dataclass(frozen=True, eq=False)
class Splice:
    """Teacher-context edit: prompt tokens [start, end) are replaced by `ids` (start == end: insertion)."""

    start: int
    end: int
    ids: torch.Tensor


@dataclass(frozen=True, eq=False)
class StepSample:
    """A step sample: prompt P, response A, privileged insertions S, and bookkeeping.

    Build with one insertion point (`insert_at`, `privileged_ids`) or several (`insertions`, a list of
    `(at, ids)` with non-decreasing `at`, e.g. SEED `teacher_mode: additive`: episode skill after the task,
    step skill before the response). After construction `insertions` is always the canonical tuple,
    `insert_at` the first insertion point and `privileged_ids` all privileged tokens in order.
    Empty privileged ids (GRPO, a skill that failed to parse) or `teacher_valid=False` mean no teacher.
    """

    prompt_ids: TokenIds
    response_ids: TokenIds
    insert_at: int | None = None
    privileged_ids: TokenIds | None = None
    insertions: Sequence[tuple[int, TokenIds]] = ()
    teacher_drops: Sequence[tuple[int, int]] = ()
    sample_id: Hashable | None = None
    teacher_valid: bool = True
    reward: float = 0.0  # outcome minus penalty
    penalty: float = 0.0  # the step's shaping penalty (>= 0), already subtracted from reward
    group_id: Hashable | None = None
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        name = self.describe()
        prompt = as_token_tensor(self.prompt_ids, f"{name}: prompt_ids")
        response = as_token_tensor(self.response_ids, f"{name}: response_ids")
        if prompt.numel() == 0:
            raise ValueError(f"{name}: prompt_ids is empty (the first response token needs a context)")
        if response.numel() == 0:
            raise ValueError(f"{name}: response_ids is empty")
        insertions = self._canonical_insertions(name, len(prompt))
        drops = self._canonical_drops(name, len(prompt), insertions)
        set_ = object.__setattr__
        set_(self, "prompt_ids", prompt)
        set_(self, "response_ids", response)
        set_(self, "insertions", insertions)
        set_(self, "teacher_drops", drops)
        set_(self, "insert_at", insertions[0][0] if insertions else None)
        privileged = [ids for _, ids in insertions]
        set_(self, "privileged_ids", torch.cat(privileged) if privileged else torch.zeros(0, dtype=torch.long))

    def _canonical_insertions(self, name: str, prompt_len: int) -> tuple[tuple[int, torch.Tensor], ...]:
        if self.insertions and (self.insert_at is not None or self.privileged_ids is not None):
            raise ValueError(f"{name}: give either insert_at/privileged_ids or insertions, not both")
        if self.insertions:
            pairs = list(self.insertions)
        elif self.insert_at is not None or self.privileged_ids is not None:
            if self.insert_at is None or self.privileged_ids is None:
                raise ValueError(f"{name}: insert_at and privileged_ids go together")
            pairs = [(self.insert_at, self.privileged_ids)]
        else:
            pairs = []
        out, previous = [], 0
        for i, pair in enumerate(pairs):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise TypeError(f"{name}: insertions[{i}] must be an (at, ids) pair")
            at, ids = pair
            if isinstance(at, bool) or not isinstance(at, int):
                raise TypeError(f"{name}: insert_at of insertions[{i}] must be an int, got {type(at).__name__}")
            if not 0 <= at <= prompt_len:
                raise ValueError(
                    f"{name}: insert_at={at} of insertions[{i}] is outside the prompt (0..{prompt_len})"
                )
            if at < previous:
                raise ValueError(f"{name}: insertion points must not decrease (insertions[{i}] at {at} < {previous})")
            previous = at
            ids = as_token_tensor(ids, f"{name}: privileged ids of insertions[{i}]")
            if ids.numel():
                out.append((at, ids))
        return tuple(out)

    def _canonical_drops(self, name: str, prompt_len: int, insertions) -> tuple[tuple[int, int], ...]:
        drops, previous_end = [], 0
        for i, span in enumerate(self.teacher_drops):
            if not isinstance(span, (tuple, list)) or len(span) != 2:
                raise TypeError(f"{name}: teacher_drops[{i}] must be a (start, end) pair")
            start, end = (int(v) for v in span)
            if not previous_end <= start <= end <= prompt_len:
                raise ValueError(
                    f"{name}: teacher_drops[{i}]=({start}, {end}) must be sorted, disjoint and inside "
                    f"the prompt (0..{prompt_len})"
                )
            previous_end = end
            for at, _ in insertions:
                if start < at < end:
                    raise ValueError(f"{name}: insertion at {at} falls inside dropped span ({start}, {end})")
            if end > start:
                drops.append((start, end))
        return tuple(drops)

    def describe(self, index: int | None = None) -> str:
        """How errors name this sample: its id, else its position in the batch when known."""
        if self.sample_id is not None:
            return f"sample {self.sample_id!r}"
        return f"samples[{index}]" if index is not None else "sample"

    @property
    def has_teacher(self) -> bool:
        """True when the teacher context exists: flagged valid and carrying privileged tokens."""
        return self.teacher_valid and len(self.insertions) > 0

    def splices(self) -> list[Splice]:
        """Insertions and dropped spans as one sorted list of non-overlapping teacher-context edits."""
        empty = torch.zeros(0, dtype=torch.long)
        edits = [Splice(at, at, ids) for at, ids in self.insertions]
        edits += [Splice(start, end, empty) for start, end in self.teacher_drops]
        # at a shared boundary an insertion goes first; spans never overlap (checked in __post_init__)
        return sorted(edits, key=lambda s: (s.start, s.end))

    def first_edit(self) -> int:
        """Length of the prompt prefix shared by the student and teacher contexts."""
        edits = self.splices() if self.has_teacher else []
        return edits[0].start if edits else len(self.prompt_ids)

    def teacher_prompt_ids(self) -> torch.Tensor:
        """The teacher's prompt: P with all splices applied (the response follows it)."""
        return spliced_suffix(self.prompt_ids, self.splices(), 0)


def spliced_suffix(prompt: torch.Tensor, splices: list[Splice], begin: int) -> torch.Tensor:
    """The teacher prompt from prompt position `begin` on; `begin` must not exceed the first splice."""
    pieces, position = [], begin
    for s in splices:
        pieces += [prompt[position : s.start], s.ids]
        position = max(position, s.end)
    pieces.append(prompt[position:])
    return torch.cat(pieces)


def check_samples(samples: Any) -> list[StepSample]:
    """A list of StepSample, or a TypeError naming the first offending element."""
    if isinstance(samples, StepSample) or not isinstance(samples, Sequence):
        raise TypeError(f"samples must be a sequence of StepSample, got {type(samples).__name__}")
    for i, s in enumerate(samples):
        if not isinstance(s, StepSample):
            raise TypeError(f"samples[{i}] must be a StepSample, got {type(s).__name__}")
    return list(samples)
