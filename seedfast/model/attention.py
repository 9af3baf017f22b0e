"""Variable-length causal attention over packed sequences, behind one function and several backends.

Sequence b has queries q[cu_q[b]:cu_q[b+1]] and keys/values k,v[cu_k[b]:cu_k[b+1]], with at least as many keys
as queries. The mask is causal and aligned bottom-right: the last query sees every key, query i of a sequence
with Lq queries and Lk keys sees keys 0 .. Lk - Lq + i. With Lq == Lk this is ordinary causal attention; with
Lk = past + Lq it is "new tokens attend to their cached prefix, then causally to each other". GQA: H query
heads share H / Hkv key/value heads.

Backends:
  sdpa   torch scaled_dot_product_attention; sequences padded into one [B, H, Lq_max, hd] batch with a boolean
         mask (measured faster on CPU than a loop over sequences for ~64 sequences of ~200 tokens).
  flex   torch FlexAttention with a block mask from cu_seqlens. Compiled on CUDA. On CPU torch 2.13 has no flex
         backward at all, and compiled CPU flex recompiles for every shape (~10 s each) and fails to compile
         with dynamic shapes; so on CPU it runs eagerly (an unfused reference that materializes scores),
         forward only: a correctness check of the mask and for no-grad scoring, not a fast path.
  flash  flash_attn_varlen_func (flash-attn package, CUDA, fp16/bf16).
  auto   flash if usable, else flex on CUDA, else sdpa.

VarlenPlan validates cu_seqlens once (one host sync) and caches backend metadata (padding indices, block
mask) so every layer of a forward pass reuses it; `varlen_attention` is the one-shot form.
"""

from __future__ import annotations

import torch

from . import attention_flash, attention_flex, attention_sdpa
from .packing import check_cu_seqlens, lengths_of

BACKENDS = ("auto", "sdpa", "flex", "flash")


def check_backend(backend: object) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return backend  # type: ignore[return-value]


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype) -> str:
    """The concrete backend that `backend` means for tensors on `device` with `dtype`."""
    check_backend(backend)
    if backend == "auto":
        if attention_flash.usable(device, dtype):
            return "flash"
        return "flex" if device.type == "cuda" else "sdpa"
    if backend == "flash" and not attention_flash.usable(device, dtype):
        raise ValueError(
            f"attention backend 'flash' needs the flash-attn package, a CUDA device and fp16/bf16 inputs "
            f"(installed: {attention_flash.installed()}, device: {device}, dtype: {dtype})"
        )
    return backend


class VarlenPlan:
    """Validated packing of queries (cu_q) against keys (cu_k), reusable across layers."""

    def __init__(self, cu_q: torch.Tensor, cu_k: torch.Tensor, backend: str = "auto") -> None:
        self.backend = check_backend(backend)
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
        self._states: dict[tuple[str, torch.device], object] = {}

    @property
    def num_sequences(self) -> int:
        return len(self.lens_q)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
        """q [Tq, H, hd], k/v [Tk, Hkv, hd] -> [Tq, H, hd]."""
        self._check_qkv(q, k, v)
        backend = resolve_backend(self.backend, q.device, q.dtype)
        if self.total_q == 0:
            return q.new_zeros(q.shape)
        key = (backend, q.device)
        if key not in self._states:
            module = _MODULES[backend]
            self._states[key] = module.prepare(self, q.device)
        return _MODULES[backend].attend(q, k, v, self._states[key], scale)

    def _check_qkv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
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


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int | None = None,
    max_k: int | None = None,
    backend: str = "auto",
    scale: float | None = None,
) -> torch.Tensor:
    """One-shot varlen attention (see the module docstring). max_q/max_k are checked when given."""
    plan = VarlenPlan(cu_q, cu_k, backend)
    if max_q is not None and max_q != plan.max_q:
        raise ValueError(f"max_q={max_q} but the longest query sequence has {plan.max_q} tokens")
    if max_k is not None and max_k != plan.max_k:
        raise ValueError(f"max_k={max_k} but the longest key sequence has {plan.max_k} tokens")
    return plan(q, k, v, scale)


_MODULES = {"sdpa": attention_sdpa, "flex": attention_flex, "flash": attention_flash}
