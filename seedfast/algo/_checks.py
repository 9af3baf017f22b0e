"""Argument checks shared by the algo modules: one clear error before torch fails deep inside."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def check_option(func: str, name: str, value: object, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{func}: unknown {name}={value!r}; allowed values: {', '.join(map(repr, allowed))}")


def check_tensor(func: str, name: str, value: object, *, floating: bool = True) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{func}: {name} must be a torch.Tensor, got {type(value).__name__}")
    if floating and not value.is_floating_point():
        raise TypeError(f"{func}: {name} must be a floating-point tensor, got dtype {value.dtype}")
    return value


def check_same_shape(func: str, ref_name: str, ref: torch.Tensor, **others: torch.Tensor | None) -> None:
    for name, tensor in others.items():
        if tensor is not None and tensor.shape != ref.shape:
            raise ValueError(
                f"{func}: {name} has shape {tuple(tensor.shape)} but {ref_name} has shape "
                f"{tuple(ref.shape)}; they must match"
            )


def check_2d(func: str, name: str, tensor: torch.Tensor) -> None:
    if tensor.dim() != 2:
        raise ValueError(f"{func}: {name} must be [B, T] (2-D), got shape {tuple(tensor.shape)}")


def check_mask(func: str, name: str, mask: object, like: torch.Tensor, like_name: str) -> torch.Tensor:
    """Masks may be bool or numeric; nonzero means valid. Returns a bool tensor."""
    check_tensor(func, name, mask, floating=False)
    check_same_shape(func, like_name, like, **{name: mask})
    return mask if mask.dtype == torch.bool else mask != 0


def check_count(func: str, name: str, value: object) -> None:
    """A global token/sequence count: None, a non-negative number or a 0-dim tensor (e.g. all-reduced)."""
    if value is None:
        return
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            raise ValueError(f"{func}: {name} must be a number or a 0-dim tensor, got shape {tuple(value.shape)}")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{func}: {name} must be a number or a 0-dim tensor, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{func}: {name} must be >= 0, got {value}")


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """At least fp32 (bf16 inputs are upcast); fp64 inputs stay fp64 for exact reference tests."""
    dtype = torch.float32
    for t in tensors:
        if t is not None:
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype
