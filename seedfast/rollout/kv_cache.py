"""Kept so `seedfast.rollout.StaticKVCache` / `decode_step` keep importing: the cache now lives in
seedfast/model/kv.py and decoding is the decoder's own `Decoder.decode`, which runs the same layer modules as
its training forward (one copy of the layer math)."""

from __future__ import annotations

import torch

from seedfast.model.kv import StaticKVCache

__all__ = ["StaticKVCache", "decode_step"]


def decode_step(model: torch.nn.Module, cache: StaticKVCache, tokens: torch.Tensor) -> torch.Tensor:
    """`model.decode(tokens, cache)`: one token per cache row -> final hidden states [B, d]."""
    return model.decode(tokens, cache)
