"""Packed varlen batches for the scorer: which tokens go into which model call, and which rows to score.

Per sample, with P the prompt, A the response and L = shared_prefix_length(sample):
    prefix call           P[:L]                                  positions 0..L-1
    student branch        P[L:] ⊕ A[:-1]                         positions L..   (attends to the prefix KV)
    teacher branch        splice(P)[L:] ⊕ A[:-1]                 positions L..   (same prefix KV)
    single context        P ⊕ A[:-1]                             positions 0..   (reference model)
The rows that predict A are the last |A| rows of each branch: the last context token and A[:-1].
L stops one token short of the prompt's end so that the student branch always holds the row that
predicts A[0] (then no hidden state of the prefix call is ever needed).

Samples that share a prefix (a GRPO group's trajectories start from one prompt, and agree on their history until
they act differently) share one copy of it in the prefix call: `distinct_prefixes` says which
(docs/performance.md, 'A prompt shared by a group is computed once').
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from seedfast.context.sample import StepSample, spliced_suffix
from seedfast.model.packing import distinct


def shared_prefix_length(sample: StepSample) -> int:
    """Prompt tokens computed once and shared by both branches (the trainer's prefix KV must match)."""
    return min(sample.first_edit(), len(sample.prompt_ids) - 1)


def student_branch(sample: StepSample, start: int) -> torch.Tensor:
    return torch.cat([sample.prompt_ids[start:], sample.response_ids[:-1]])


def teacher_branch(sample: StepSample, start: int) -> torch.Tensor:
    return torch.cat([spliced_suffix(sample.prompt_ids, sample.splices(), start), sample.response_ids[:-1]])


@dataclass
class Packed:
    """Sequences concatenated without padding, plus the rows whose next token is scored."""

    input_ids: torch.Tensor  # [T] int64
    cu_seqlens: torch.Tensor  # [n + 1] int32
    position_ids: torch.Tensor  # [T] int64
    rows: torch.Tensor  # [R] int64 indices into the T rows
    targets: torch.Tensor  # [R] int64, the token each row predicts
    scored: list[int]  # per sequence, how many of its last rows are scored (the rows, in order)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    def to(self, device: torch.device | str) -> Packed:
        return Packed(*(t.to(device) for t in (self.input_ids, self.cu_seqlens, self.position_ids,
                                                self.rows, self.targets)), self.scored)


def pack(sequences: Sequence[torch.Tensor], starts: Sequence[int], targets: Sequence[torch.Tensor]) -> Packed:
    """Pack sequences; sequence i has positions starts[i].. and its last len(targets[i]) rows predict them."""
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    cu = torch.zeros(len(sequences) + 1, dtype=torch.long)
    cu[1:] = torch.cumsum(lengths, 0)
    total = int(cu[-1])
    seq_of_row = torch.repeat_interleave(torch.arange(len(sequences)), lengths)
    offsets = torch.tensor(list(starts), dtype=torch.long) - cu[:-1]
    position_ids = torch.arange(total) + offsets[seq_of_row] if total else torch.zeros(0, dtype=torch.long)
    n_targets = torch.tensor([len(t) for t in targets], dtype=torch.long)
    rows = torch.cat([torch.arange(int(cu[i + 1]) - int(n), int(cu[i + 1])) for i, n in enumerate(n_targets)]
                     ) if len(sequences) else torch.zeros(0, dtype=torch.long)
    return Packed(
        input_ids=torch.cat(list(sequences)) if len(sequences) else torch.zeros(0, dtype=torch.long),
        cu_seqlens=cu.to(torch.int32),
        position_ids=position_ids,
        rows=rows,
        targets=torch.cat(list(targets)) if len(targets) else torch.zeros(0, dtype=torch.long),
        scored=n_targets.tolist(),
    )


def pack_prefixes(samples: Sequence[StepSample], lengths: Sequence[int]) -> Packed:
    """The shared prefixes P[:L] (no scored rows)."""
    empty = torch.zeros(0, dtype=torch.long)
    return pack([s.prompt_ids[:n] for s, n in zip(samples, lengths)], [0] * len(samples), [empty] * len(samples))


def pack_branches(samples: Sequence[StepSample], lengths: Sequence[int], teacher: Sequence[bool]) -> Packed:
    """Student branches of all samples, then teacher branches where `teacher[i]`: one packed call."""
    sequences = [student_branch(s, n) for s, n in zip(samples, lengths)]
    starts, targets = list(lengths), [s.response_ids for s in samples]
    for s, n, t in zip(samples, lengths, teacher):
        if t:
            sequences.append(teacher_branch(s, n))
            starts.append(n)
            targets.append(s.response_ids)
    return pack(sequences, starts, targets)


def pack_single(samples: Sequence[StepSample]) -> Packed:
    """One context per sample: P ⊕ A[:-1] from position 0."""
    return pack([student_branch(s, 0) for s in samples], [0] * len(samples), [s.response_ids for s in samples])


def distinct_prefixes(samples: Sequence[StepSample], lengths: Sequence[int]) -> tuple[list[int], list[int]]:
    """The prefixes P[:lengths[i]] computed once each: (the first sample of each distinct prefix, and for every sample
    the position of its prefix in that list)."""
    return distinct(tuple(s.prompt_ids[:n].tolist()) for s, n in zip(samples, lengths))


def prompt_order(samples: Sequence[StepSample], index: Sequence[int]) -> list[int]:
    """`index` with the samples of one prompt next to each other (in the order their prompts first appear), so
    consecutive micro-batches hold each prompt's samples together."""
    rank: dict[tuple[int, ...], int] = {}
    keyed = []
    for i in index:
        key = tuple(samples[i].prompt_ids.tolist())
        keyed.append((rank.setdefault(key, len(rank)), i))
    return [i for _, i in sorted(keyed, key=lambda pair: pair[0])]


def split_by_budget(costs: Sequence[Sequence[int]], budget: int, names: Sequence[str]) -> list[list[int]]:
    """Consecutive groups of sample indices such that, for each model call c, sum of costs[i][c] <= budget.

    `costs[i]` lists sample i's tokens in each call of a micro-batch. A sample that alone exceeds
    the budget in some call raises, naming it.
    """
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise ValueError(f"token_budget must be a positive int, got {budget!r}")
    groups: list[list[int]] = []
    totals: list[int] = []
    for i, cost in enumerate(costs):
        if max(cost) > budget:
            raise ValueError(
                f"{names[i]} needs {max(cost)} tokens in one model call, over token_budget={budget}; "
                "raise token_budget (samples are never split)"
            )
        if groups and all(t + c <= budget for t, c in zip(totals, cost)):
            groups[-1].append(i)
            totals = [t + c for t, c in zip(totals, cost)]
        else:
            groups.append([i])
            totals = list(cost)
    return groups

