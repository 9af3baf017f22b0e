"""A preallocated KV cache for decoding, and the one-token decode step of a seedfast Decoder over it.

Growing a PackedKV by one token per sequence (`PackedKV.concat`) copies the whole cache every step, and the
decoder's packed attention re-packs and pads it again in every layer. Here each layer's cache is one
[B, n_kv_heads, capacity, head_dim] buffer: a step writes one key/value per sequence in place and attends
to a view of it, so a step costs O(cached tokens) reads and no copies.

`decode_step` is the decoder's forward specialised to one new token per sequence; it reads the decoder's
modules by their HF names (q_proj, q_norm, input_layernorm, mlp, ...) and its tests hold it equal to the
decoder's own forward for every family.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from seedfast.model.kv import PackedKV
from seedfast.model.layers import apply_rope, rope_cos_sin


@dataclass
class StaticKVCache:
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
    def num_rows(self) -> int:
        return self.lengths.numel()

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def select(self, rows: torch.Tensor) -> StaticKVCache:
        """Keep only `rows` (a copy: done when finished sequences are dropped, not every step)."""
        return StaticKVCache([k[rows] for k in self.keys], [v[rows] for v in self.values], self.lengths[rows])


def decode_step(model: torch.nn.Module, cache: StaticKVCache, tokens: torch.Tensor) -> torch.Tensor:
    """Feed one token per cache row; returns its final hidden state [B, d] and appends its KV to `cache`."""
    if tokens.shape != (cache.num_rows,):
        raise ValueError(f"tokens must be [{cache.num_rows}] (one per cache row), got {tuple(tokens.shape)}")
    positions = cache.lengths
    if int(positions.max()) >= cache.capacity:
        raise ValueError(f"the KV cache is full (capacity {cache.capacity} tokens per sequence)")
    cfg = model.config
    n_heads, n_kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    B = tokens.shape[0]
    h = model.model.embed_tokens(tokens)
    cos, sin = rope_cos_sin(model.inv_freq, positions, h.dtype)
    span = int(positions.max()) + 1
    mask = (torch.arange(span, device=tokens.device)[None, :] <= positions[:, None])[:, None, None, :]
    rows = torch.arange(B, device=tokens.device)
    gqa = {"enable_gqa": True} if n_heads != n_kv else {}
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q = attn.q_proj(x).view(B, n_heads, hd)
        k = attn.k_proj(x).view(B, n_kv, hd)
        v = attn.v_proj(x).view(B, n_kv, hd)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        cache.keys[i][rows, :, positions] = k
        cache.values[i][rows, :, positions] = v
        out = F.scaled_dot_product_attention(
            q[:, :, None, :], cache.keys[i][:, :, :span], cache.values[i][:, :, :span],
            attn_mask=mask, scale=hd**-0.5, **gqa,
        )
        h = h + attn.o_proj(out.reshape(B, n_heads * hd))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    cache.lengths = positions + 1
    return model.model.norm(h)
