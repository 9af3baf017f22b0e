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

VarlenPlan validates cu_seqlens once (one host sync; the layout, varlen.py) and caches backend metadata (padding
indices, block mask) so every layer of a forward pass reuses it; `varlen_attention` is the one-shot form.
"""

from __future__ import annotations

import torch

from . import attention_flash, attention_flex, attention_sdpa
from .varlen import VarlenLayout

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


class VarlenPlan(VarlenLayout):
    """Validated packing of queries (cu_q) against keys (cu_k), reusable across layers: the layout (varlen.py) and
    each backend's metadata for it, built on first use."""

    def __init__(self, cu_q: torch.Tensor, cu_k: torch.Tensor, backend: str = "auto") -> None:
        self.backend = check_backend(backend)
        super().__init__(cu_q, cu_k)
        self._states: dict[tuple[str, torch.device], object] = {}

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
        """q [Tq, H, hd], k/v [Tk, Hkv, hd] -> [Tq, H, hd]."""
        self.check_qkv(q, k, v)
        backend = resolve_backend(self.backend, q.device, q.dtype)
        if self.total_q == 0:
            return q.new_zeros(q.shape)
        key = (backend, q.device)
        if key not in self._states:
            module = _MODULES[backend]
            self._states[key] = module.prepare(self, q.device)
        return _MODULES[backend].attend(q, k, v, self._states[key], scale)


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
