"""Packed variable-length batches: validation of cu_seqlens / input_ids and per-token bookkeeping.

A packed batch of B sequences is a flat [T] token tensor plus cu_seqlens [B+1] int32 (cu[0] = 0,
non-decreasing, cu[B] = T); sequence b owns tokens cu[b]:cu[b+1]. Empty sequences are allowed.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

import torch


def check_cu_seqlens(cu_seqlens: object, total: int | None, name: str = "cu_seqlens") -> list[int]:
    """Validate cu_seqlens (and that it ends at `total` when given); return it as a host list (one sync)."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype != torch.int32:
        raise ValueError(f"{name} must be int32, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"{name} must be 1-D with B+1 >= 2 entries, got shape {tuple(cu_seqlens.shape)}")
    cu = cu_seqlens.tolist()
    if cu[0] != 0:
        raise ValueError(f"{name} must start at 0, got {cu[0]}")
    if any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"{name} must be non-decreasing, got {cu}")
    if total is not None and cu[-1] != total:
        raise ValueError(f"{name} must end at the number of tokens {total}, got {cu[-1]}")
    return cu


def check_input_ids(input_ids: object) -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
    if input_ids.dtype != torch.int64:
        raise ValueError(f"input_ids must be int64, got {input_ids.dtype}")
    if input_ids.dim() != 1:
        raise ValueError(f"input_ids must be 1-D packed [T], got shape {tuple(input_ids.shape)}")
    return input_ids


def lengths_of(cu: list[int]) -> list[int]:
    return [b - a for a, b in zip(cu, cu[1:])]


def make_cu_seqlens(lengths: list[int] | torch.Tensor, device: torch.device | str | None = None) -> torch.Tensor:
    """[B+1] int32 cumulative offsets from per-sequence lengths."""
    lengths = torch.as_tensor(lengths, dtype=torch.int64, device=device)
    cu = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=lengths.device)
    cu[1:] = lengths.cumsum(0)
    return cu


def sequence_index(lengths: list[int], device: torch.device) -> torch.Tensor:
    """[T] int64: which sequence each packed token belongs to."""
    counts = torch.tensor(lengths, dtype=torch.int64, device=device)
    return torch.repeat_interleave(torch.arange(len(lengths), device=device), counts, output_size=sum(lengths))


def positions_in_sequence(cu: list[int], device: torch.device, offsets: list[int] | None = None) -> torch.Tensor:
    """[T] int64: each token's index within its sequence, plus that sequence's offset (e.g. past length)."""
    lengths = lengths_of(cu)
    seq = sequence_index(lengths, device)
    starts = torch.tensor(cu[:-1], dtype=torch.int64, device=device)
    pos = torch.arange(cu[-1], dtype=torch.int64, device=device) - starts[seq]
    if offsets is not None:
        pos = pos + torch.tensor(offsets, dtype=torch.int64, device=device)[seq]
    return pos


def distinct(keys: Iterable[Hashable]) -> tuple[list[int], list[int]]:
    """Each distinct key once: (the index of its first occurrence, and for every key the position of its first
    occurrence in that list). What runs once for a batch that repeats a prompt (a GRPO group at its first step), a
    teacher context, or a greedy generation."""
    first: list[int] = []
    owner: list[int] = []
    seen: dict[Hashable, int] = {}
    for i, key in enumerate(keys):
        if key not in seen:
            seen[key] = len(first)
            first.append(i)
        owner.append(seen[key])
    return first, owner
