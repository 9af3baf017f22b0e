"""The decoder's two KV caches.

PackedKV: per-layer keys/values of B packed sequences, and the sequence-level operations callers need.

    kv = model(prefix_ids, cu_prefix, return_kv=True)[1]       # keys are post-RoPE
    both = kv.repeat_interleave(2)                              # student and teacher branch on one prefix
    hidden = model(suffix_ids, cu_suffix, past=both)            # suffix b attends to both[b] then itself
    hidden, new = model(next_ids, cu_next, past=kv, return_kv=True)
    kv = kv.concat(new)                                         # generation: grow every sequence's cache

StaticKVCache: preallocated per-layer buffers for token-by-token decoding (Decoder.prefill / Decoder.decode).
Growing a PackedKV by one token per sequence copies the whole cache every step, and the packed attention
re-packs it in every layer; here each layer's cache is one [B, n_kv_heads, capacity, head_dim] buffer, a step
writes one key/value per row in place and attends to a view of it, so a step reads O(cached tokens) and copies
nothing.

    hidden, cache = model.prefill(prompt_ids, cu_prompts, capacity)    # [B, d] last tokens; cache row b = prompt b
    hidden = model.decode(next_ids, cache)                            # [B, d]; cache.lengths += 1
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .packing import check_cu_seqlens, make_cu_seqlens


@dataclass
class PackedKV:
    keys: list[torch.Tensor]  # per layer [T, n_kv_heads, head_dim]
    values: list[torch.Tensor]  # per layer [T, n_kv_heads, head_dim]
    cu_seqlens: torch.Tensor  # [B+1] int32

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.values) or not self.keys:
            raise ValueError(
                f"PackedKV needs one keys and one values tensor per layer, got {len(self.keys)} keys and "
                f"{len(self.values)} values"
            )
        shape = self.keys[0].shape
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            if k.dim() != 3 or k.shape != shape or v.shape != shape:
                raise ValueError(
                    f"PackedKV layer {i}: keys {tuple(k.shape)} and values {tuple(v.shape)} must both be "
                    f"{tuple(shape)} [tokens, n_kv_heads, head_dim]"
                )
        if not isinstance(self.cu_seqlens, torch.Tensor) or self.cu_seqlens.dtype != torch.int32:
            raise ValueError("PackedKV.cu_seqlens must be an int32 tensor [B+1]")
        if self.cu_seqlens.dim() != 1 or self.cu_seqlens.numel() < 2:
            raise ValueError(f"PackedKV.cu_seqlens must be 1-D [B+1], got shape {tuple(self.cu_seqlens.shape)}")

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    @property
    def num_sequences(self) -> int:
        return self.cu_seqlens.numel() - 1

    @property
    def num_tokens(self) -> int:
        return self.keys[0].shape[0]

    @property
    def lengths(self) -> torch.Tensor:
        """[B] int64: tokens per sequence."""
        return self.cu_seqlens.diff().long()

    def check(self) -> list[int]:
        """Full validation (one host sync); returns cu_seqlens as a list."""
        return check_cu_seqlens(self.cu_seqlens, self.num_tokens, "past.cu_seqlens")

    def select(self, index: torch.Tensor | list[int]) -> PackedKV:
        """The sequences at `index`, in that order; repeats and drops are allowed (e.g. [2, 0, 0])."""
        index = torch.as_tensor(index, dtype=torch.int64, device=self.cu_seqlens.device)
        if index.dim() != 1:
            raise ValueError(f"index must be 1-D, got shape {tuple(index.shape)}")
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= self.num_sequences):
            raise ValueError(f"index must lie in [0, {self.num_sequences}), got {index.tolist()}")
        gather, cu = select_gather_index(self.cu_seqlens, index)
        return self._gathered(gather, cu)

    def repeat_interleave(self, repeats: int | torch.Tensor | list[int]) -> PackedKV:
        """Each sequence repeated `repeats` times in place: [a, b] x2 -> [a, a, b, b]."""
        seqs = torch.arange(self.num_sequences, device=self.cu_seqlens.device)
        repeats = torch.as_tensor(repeats, dtype=torch.int64, device=seqs.device)
        return self.select(seqs.repeat_interleave(repeats))

    def concat(self, other: PackedKV) -> PackedKV:
        """Per sequence b: self[b] followed by other[b] (both must hold the same B and layers)."""
        if other.num_sequences != self.num_sequences or other.num_layers != self.num_layers:
            raise ValueError(
                f"concat needs the same sequences and layers, got B={self.num_sequences}/{other.num_sequences}, "
                f"layers={self.num_layers}/{other.num_layers}"
            )
        if other.keys[0].shape[1:] != self.keys[0].shape[1:]:
            raise ValueError(f"concat: head shapes differ, {tuple(self.keys[0].shape)} vs {tuple(other.keys[0].shape)}")
        gather, cu = concat_gather_index(self.cu_seqlens, other.cu_seqlens.to(self.cu_seqlens.device))
        return PackedKV(
            [torch.cat([a, b])[gather] for a, b in zip(self.keys, other.keys)],
            [torch.cat([a, b])[gather] for a, b in zip(self.values, other.values)],
            cu,
        )

    def to(self, *args, **kwargs) -> PackedKV:
        """Tensor.to on every key/value (cu_seqlens follows the device only)."""
        keys = [k.to(*args, **kwargs) for k in self.keys]
        return PackedKV(keys, [v.to(*args, **kwargs) for v in self.values], self.cu_seqlens.to(keys[0].device))

    def detach(self) -> PackedKV:
        return PackedKV([k.detach() for k in self.keys], [v.detach() for v in self.values], self.cu_seqlens)

    def _gathered(self, gather: torch.Tensor, cu: torch.Tensor) -> PackedKV:
        return PackedKV([k[gather] for k in self.keys], [v[gather] for v in self.values], cu)


class DecodeStep(NamedTuple):
    """One decode step over a StaticKVCache: attend to columns [0, span); mask [B, 1, 1, span] marks the
    columns each row may see (its cached tokens and the one being written); rows = arange(B)."""

    span: int
    mask: torch.Tensor
    rows: torch.Tensor


@dataclass
class StaticKVCache:
    """Per-layer [B, n_kv_heads, capacity, head_dim] key/value buffers; row b holds lengths[b] tokens.

    Keys are post-RoPE like PackedKV's. The decoder writes the keys/values of a decode step at position
    lengths[b] of row b (`write`) and advances `lengths` once all layers are done (`advance`).
    """

    keys: list[torch.Tensor]  # per layer [B, n_kv_heads, capacity, head_dim]
    values: list[torch.Tensor]
    lengths: torch.Tensor  # [B] int64: cached tokens per row

    @classmethod
    def from_packed(cls, kv: PackedKV, capacity: int) -> StaticKVCache:
        """Copy a prefill's PackedKV into buffers with room for `capacity` tokens per sequence."""
        lengths = kv.lengths.to(kv.keys[0].device)
        if kv.num_sequences and int(lengths.max()) > capacity:
            raise ValueError(f"capacity={capacity} is below the longest cached sequence ({int(lengths.max())})")
        rows = torch.repeat_interleave(torch.arange(kv.num_sequences, device=lengths.device), lengths)
        cols = torch.arange(kv.num_tokens, device=lengths.device) - kv.cu_seqlens[:-1].long().to(lengths.device)[rows]
        keys, values = [], []
        for k, v in zip(kv.keys, kv.values):
            n_kv, hd = k.shape[1:]
            buf_k = k.new_zeros(kv.num_sequences, n_kv, capacity, hd)
            buf_v = v.new_zeros(kv.num_sequences, n_kv, capacity, hd)
            buf_k.transpose(1, 2)[rows, cols] = k
            buf_v.transpose(1, 2)[rows, cols] = v
            keys.append(buf_k)
            values.append(buf_v)
        return cls(keys, values, lengths.clone())

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    @property
    def num_rows(self) -> int:
        return self.lengths.numel()

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def select(self, rows: torch.Tensor) -> StaticKVCache:
        """Keep only `rows` (a copy: done when finished sequences are dropped, not every step)."""
        return StaticKVCache([k[rows] for k in self.keys], [v[rows] for v in self.values], self.lengths[rows])

    def begin_step(self) -> DecodeStep:
        """What every layer of the next step needs, computed once; raises when a row is full."""
        longest = int(self.lengths.max())  # the step's one host sync
        if longest >= self.capacity:
            raise ValueError(f"the KV cache is full (capacity {self.capacity} tokens per sequence)")
        span = longest + 1
        columns = torch.arange(span, device=self.lengths.device)
        mask = (columns[None, :] <= self.lengths[:, None])[:, None, None, :]
        return DecodeStep(span, mask, torch.arange(self.num_rows, device=self.lengths.device))

    def write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, step: DecodeStep
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store one step's k, v [B, n_kv_heads, head_dim] at each row's next position; returns the layer's keys
        and values over the step's span of columns, the new ones included."""
        self.keys[layer][step.rows, :, self.lengths] = k
        self.values[layer][step.rows, :, self.lengths] = v
        return self.keys[layer][:, :, : step.span], self.values[layer][:, :, : step.span]

    def advance(self) -> None:
        """Count the step's token in every row (after all layers wrote it)."""
        self.lengths = self.lengths + 1


def select_gather_index(cu: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token gather index and new cu_seqlens for taking sequences `index` of a packed batch."""
    lengths = cu.diff().long()[index]
    new_cu = make_cu_seqlens(lengths)
    total = int(new_cu[-1])
    starts = cu[:-1].long()[index]
    shift = torch.repeat_interleave(starts - new_cu[:-1].long(), lengths, output_size=total)
    return shift + torch.arange(total, device=cu.device), new_cu


def concat_gather_index(cu_a: torch.Tensor, cu_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Index into cat(a, b) that interleaves sequences as a[0], b[0], a[1], b[1], ..., and its cu_seqlens."""
    len_a, len_b = cu_a.diff().long(), cu_b.diff().long()
    new_cu = make_cu_seqlens(len_a + len_b)
    total, total_a = int(new_cu[-1]), int(cu_a[-1])
    seq = torch.repeat_interleave(torch.arange(len_a.numel(), device=cu_a.device), len_a + len_b, output_size=total)
    local = torch.arange(total, device=cu_a.device) - new_cu[:-1].long()[seq]
    from_a = local < len_a[seq]
    src_a = cu_a[:-1].long()[seq] + local
    src_b = total_a + cu_b[:-1].long()[seq] + local - len_a[seq]
    return torch.where(from_a, src_a, src_b), new_cu
