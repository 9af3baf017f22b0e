"""PackedKV: per-layer keys/values of B packed sequences, and the sequence-level operations callers need.

    kv = model(prefix_ids, cu_prefix, return_kv=True)[1]       # keys are post-RoPE
    both = kv.repeat_interleave(2)                              # student and teacher branch on one prefix
    hidden = model(suffix_ids, cu_suffix, past=both)            # suffix b attends to both[b] then itself
    hidden, new = model(next_ids, cu_next, past=kv, return_kv=True)
    kv = kv.concat(new)                                         # generation: grow every sequence's cache
"""

from __future__ import annotations

from dataclasses import dataclass

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
