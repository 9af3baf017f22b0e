"""FlexAttention backend: one packed [1, H, T, hd] call with a document + bottom-right causal block mask.

Compiled on CUDA. On CPU the eager (unfused) implementation runs instead, forward only: see attention.py.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .packing import positions_in_sequence, sequence_index

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

    from .varlen import VarlenLayout


@dataclass
class FlexState:
    block_mask: BlockMask
    compiled: bool


@functools.cache
def _compiled_create_block_mask():
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask)


@functools.cache
def _compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def prepare(plan: VarlenLayout, device: torch.device) -> FlexState:
    from torch.nn.attention.flex_attention import create_block_mask

    q_seq = sequence_index(plan.lens_q, device)
    k_seq = sequence_index(plan.lens_k, device)
    # query i of sequence b sees keys 0 .. i + (Lk_b - Lq_b) of b
    offsets = [lk - lq for lq, lk in zip(plan.lens_q, plan.lens_k)]
    q_limit = positions_in_sequence(plan.cu_q_list, device, offsets)
    k_pos = positions_in_sequence(plan.cu_k_list, device)

    def document_causal(b, h, q_idx, kv_idx):
        return (q_seq[q_idx] == k_seq[kv_idx]) & (k_pos[kv_idx] <= q_limit[q_idx])

    compiled = device.type == "cuda"
    # compiled, the [Tq, Tk] mask is evaluated block by block instead of materialized
    make_mask = _compiled_create_block_mask() if compiled else create_block_mask
    block_mask = make_mask(document_causal, None, None, plan.total_q, plan.total_k, device=device)
    return FlexState(block_mask, compiled)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: FlexState, scale: float | None) -> torch.Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    if not s.compiled and torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        raise ValueError(
            "attention backend 'flex' has no backward on CPU (a torch limitation); use backend='sdpa' for "
            "training on CPU, or run under torch.no_grad()"
        )
    if not s.compiled:  # torch refuses CPU inputs that require grad even under no_grad
        q, k, v = q.detach(), k.detach(), v.detach()
    qb, kb, vb = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    gqa = q.shape[1] != k.shape[1]
    if s.compiled:
        out = _compiled_flex_attention()(qb, kb, vb, block_mask=s.block_mask, scale=scale, enable_gqa=gqa)
    else:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            out = flex_attention(qb, kb, vb, block_mask=s.block_mask, scale=scale, enable_gqa=gqa)
    return out.squeeze(0).transpose(0, 1)
