"""The varlen layout: queries packed by cu_q against keys packed by cu_k, validated once (one host sync).

What the attention backends (attention_{sdpa,flex,flash}.py) read to build their metadata. It lives apart from
attention.py's VarlenPlan, which dispatches to those backends, so that a backend never imports attention.py.
"""

from __future__ import annotations

import torch

from .packing import check_cu_seqlens, lengths_of


class VarlenLayout:
    """Validated packing of queries (cu_q) against keys (cu_k): host copies, lengths, totals and maxima."""

    def __init__(self, cu_q: torch.Tensor, cu_k: torch.Tensor) -> None:
        cu_q_list = check_cu_seqlens(cu_q, None, "cu_q")
        cu_k_list = check_cu_seqlens(cu_k, None, "cu_k")
        if len(cu_q_list) != len(cu_k_list):
            raise ValueError(
                f"cu_q and cu_k must describe the same number of sequences, got {len(cu_q_list) - 1} "
                f"and {len(cu_k_list) - 1}"
            )
        if cu_q.device != cu_k.device:
            raise ValueError(f"cu_q is on {cu_q.device} but cu_k is on {cu_k.device}")
        self.cu_q, self.cu_k = cu_q, cu_k
        self.cu_q_list, self.cu_k_list = cu_q_list, cu_k_list
        self.lens_q, self.lens_k = lengths_of(cu_q_list), lengths_of(cu_k_list)
        short = [b for b, (lq, lk) in enumerate(zip(self.lens_q, self.lens_k)) if lk < lq]
        if short:
            b = short[0]
            raise ValueError(
                f"sequence {b} has {self.lens_q[b]} queries but only {self.lens_k[b]} keys; bottom-right "
                f"causal attention needs at least as many keys as queries"
            )
        self.total_q, self.total_k = cu_q_list[-1], cu_k_list[-1]
        self.max_q, self.max_k = max(self.lens_q), max(self.lens_k)

    @property
    def num_sequences(self) -> int:
        return len(self.lens_q)

    def check_qkv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Raise unless q [Tq, H, hd] and k, v [Tk, Hkv, hd] fit this layout (GQA: Hkv divides H)."""
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 3:
                shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name} must be a 3-D tensor [tokens, heads, head_dim], got {shape}")
        if q.shape[0] != self.total_q:
            raise ValueError(f"q has {q.shape[0]} tokens but cu_q ends at {self.total_q}")
        if k.shape[0] != self.total_k or v.shape[0] != self.total_k:
            raise ValueError(f"k/v have {k.shape[0]}/{v.shape[0]} tokens but cu_k ends at {self.total_k}")
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
        if q.shape[2] != k.shape[2]:
            raise ValueError(f"q head_dim {q.shape[2]} != k head_dim {k.shape[2]}")
        if q.shape[1] % k.shape[1]:
            raise ValueError(f"q heads ({q.shape[1]}) must be a multiple of k/v heads ({k.shape[1]})")
        if not (q.dtype == k.dtype == v.dtype):
            raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
        if not (q.device == k.device == v.device):
            raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
