"""Scorer outputs: packed per-token tensors in sample order, viewable per sample."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ScoreResult:
    """One sample's response tokens: log-probs, and the teacher's / entropy when computed."""

    logprob: torch.Tensor  # [|A|] fp32
    teacher_logprob: torch.Tensor | None  # [|A|] fp32, None when the sample has no teacher
    entropy: torch.Tensor | None  # [|A|] fp32, None unless asked

    @property
    def old_logprob(self) -> torch.Tensor:
        return self.logprob


@dataclass(frozen=True)
class Scores:
    """Packed results: sample i owns tokens offsets[i]:offsets[i+1] (its response, in order).

    `logprob` is ℓold from `score` (ℓref from `score_reference`). `teacher_logprob` is 0 where
    `teacher_mask` is False (samples without a valid teacher), so it can go straight into a loss
    together with the mask. `teacher_hidden` (`score(..., keep_teacher_hidden=True)`) holds the teacher's final hidden
    state of each row, the one its log-prob comes from (after the final norm, what the LM head reads; zeros where
    `teacher_mask` is False): full-vocabulary divergences recompute the teacher's distribution from it without
    [N, V] logits. `len()`, indexing and iteration give per-sample `ScoreResult`s.
    """

    offsets: torch.Tensor  # [B + 1] int64, on CPU
    logprob: torch.Tensor  # [N] fp32
    teacher_logprob: torch.Tensor | None  # [N] fp32 or None (single-context scoring)
    teacher_mask: torch.Tensor | None  # [N] bool or None
    entropy: torch.Tensor | None  # [N] fp32 or None
    teacher_hidden: torch.Tensor | None = None  # [N, d] in the model's dtype, or None unless asked

    @property
    def old_logprob(self) -> torch.Tensor:
        return self.logprob

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> ScoreResult:
        if not -len(self) <= i < len(self):
            raise IndexError(f"sample index {i} out of range for {len(self)} samples")
        i %= len(self)
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        teacher = None
        if self.teacher_logprob is not None and bool(self.teacher_mask[lo:hi].all()):
            teacher = self.teacher_logprob[lo:hi]
        entropy = self.entropy[lo:hi] if self.entropy is not None else None
        return ScoreResult(self.logprob[lo:hi], teacher, entropy)

    def __iter__(self) -> Iterator[ScoreResult]:
        return (self[i] for i in range(len(self)))


def spread_scores(part: Scores | None, samples: list, left_out: list[int], *, with_teacher: bool) -> Scores:
    """Scores over every sample of `samples` from `part`, the scores of those not in `left_out` (in order): the
    left-out samples' tokens hold placeholders (log-prob 0, teacher_mask False, zero hidden rows) for a caller that
    computes them elsewhere (the first mini-batch that scores itself: train/rl.py). `with_teacher` gives teacher
    tensors when `part` is None (nothing was scored)."""
    lengths = torch.tensor([len(s.response_ids) for s in samples], dtype=torch.long)
    offsets = torch.zeros(len(samples) + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(lengths, 0)
    skipped = set(left_out)
    kept = [i for i in range(len(samples)) if i not in skipped]
    if part is not None and len(part) != len(kept):
        raise ValueError(f"spread_scores: {len(part)} scored samples for the {len(kept)} not left out")
    index = torch.cat([torch.arange(int(offsets[i]), int(offsets[i + 1])) for i in kept]) if kept else \
        torch.zeros(0, dtype=torch.long)
    n = int(offsets[-1])

    def spread(values: torch.Tensor | None, fill: torch.Tensor) -> torch.Tensor:
        if values is not None:
            fill[index.to(fill.device)] = values.to(fill.dtype)
        return fill

    device = part.logprob.device if part is not None else torch.device("cpu")
    logprob = spread(part.logprob if part else None, torch.zeros(n, device=device))
    teacher = mask = hidden = entropy = None
    if (part.teacher_logprob is not None) if part is not None else with_teacher:
        teacher = spread(part.teacher_logprob if part else None, torch.zeros(n, device=device))
        mask = spread(part.teacher_mask if part else None, torch.zeros(n, dtype=torch.bool, device=device))
    if part is not None and part.teacher_hidden is not None:
        d = part.teacher_hidden.shape[1]
        hidden = spread(part.teacher_hidden, part.teacher_hidden.new_zeros(n, d))
    if part is not None and part.entropy is not None:
        entropy = spread(part.entropy, torch.zeros(n, device=device))
    return Scores(offsets, logprob, teacher, mask, entropy, hidden)
