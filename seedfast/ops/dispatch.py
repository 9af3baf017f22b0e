"""Backend selection for seedfast.ops.

A backend is a module exposing `forward`, `backward` and `token_loss` (optionally
`fused_forward_backward`), see the ops contract. Keywords of the protocol: forward(..., check_targets=)
(False when the caller range-checked the targets already: the public ops, one host sync per call), and
backward / fused_forward_backward(..., need_hidden_grad=, need_weight_grad=) (a gradient not needed is
returned as None and its GEMM skipped, e.g. a frozen LM head). `torch` is seedfast/ops/chunked.py and runs anywhere;
`triton` is seedfast/ops/triton_backend.py and needs CUDA tensors (or TRITON_INTERPRET=1 on CPU).
"auto" picks triton on CUDA when it imports, else torch; env SEEDFAST_OPS_BACKEND=torch|triton
overrides "auto" (an explicit backend argument wins over the environment).
"""

from __future__ import annotations

import importlib
import os
import warnings
from types import ModuleType

import torch

from . import chunked

BACKENDS = ("auto", "torch", "triton")
BACKEND_ENV = "SEEDFAST_OPS_BACKEND"

_warned_fallback = False


def _triton_module() -> ModuleType:
    return importlib.import_module("seedfast.ops.triton_backend")


def resolve_backend_name(name: str, device: torch.device) -> str:
    """The concrete backend ("torch" or "triton") that `name` means for tensors on `device`."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend={name!r}; allowed values: {', '.join(map(repr, BACKENDS))}")
    if name == "auto":
        forced = os.environ.get(BACKEND_ENV, "")
        if forced:
            if forced not in ("torch", "triton"):
                raise ValueError(f"unknown {BACKEND_ENV}={forced!r}; allowed values: 'torch', 'triton'")
            name = forced
    if name == "auto":
        return "triton" if torch.device(device).type == "cuda" else "torch"
    return name


def get_backend(name: str, device: torch.device | str) -> ModuleType:
    """The backend module for `name` ("auto", "torch", "triton") and tensors on `device`."""
    global _warned_fallback
    device = torch.device(device)
    explicit = name == "triton" or (name == "auto" and os.environ.get(BACKEND_ENV) == "triton")
    resolved = resolve_backend_name(name, device)
    if resolved == "torch":
        return chunked
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"backend='triton' needs CUDA tensors (got device {device}); on CPU it runs only "
                         "under TRITON_INTERPRET=1. Use backend='torch' or 'auto'.")
    try:
        return _triton_module()
    except ImportError as err:
        if explicit:
            raise ValueError(f"backend='triton' is not available: {err}") from err
        if not _warned_fallback:
            warnings.warn(f"seedfast.ops: Triton backend unavailable ({err}); using the torch backend",
                          RuntimeWarning, stacklevel=3)
            _warned_fallback = True
        return chunked


def get_divergence_backend(name: str, device: torch.device | str) -> ModuleType:
    """The module with the divergence protocol (ops/divergence.py) for `name` and `device`: the torch backend itself
    (seedfast/ops/chunked.py re-exports chunked_divergence.py), or seedfast/ops/triton_divergence.py beside the Triton
    backend, which it uses and which does not import it."""
    backend = get_backend(name, device)
    if backend is chunked:
        return chunked
    return importlib.import_module("seedfast.ops.triton_divergence")
