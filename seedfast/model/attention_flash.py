"""flash-attn backend: flash_attn_varlen_func (causal masks are bottom-right aligned since flash-attn 2.1)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .varlen import VarlenLayout


@functools.cache
def _varlen_func():
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


def installed() -> bool:
    return _varlen_func() is not None


def usable(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cuda" and dtype in (torch.float16, torch.bfloat16) and installed()


@dataclass
class FlashState:
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int


def prepare(plan: VarlenLayout, device: torch.device) -> FlashState:
    return FlashState(plan.cu_q.to(device), plan.cu_k.to(device), plan.max_q, plan.max_k)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: FlashState, scale: float | None) -> torch.Tensor:
    return _varlen_func()(q, k, v, s.cu_q, s.cu_k, s.max_q, s.max_k, softmax_scale=scale, causal=True)
