"""SDPA backend: pad the packed sequences into one batch and mask per sequence.

Padded query rows are allowed to see every key (their output is dropped): a fully masked row would give NaN
in forward and NaN gradients for the real keys in backward. Where every sequence has as many keys as queries the
batch needs no mask at all: plain causal attention gives each real row what it sees (a padded row sees key 0 at least).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from .varlen import VarlenLayout

_HAS_ENABLE_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


@dataclass
class SdpaState:
    batch: int
    max_q: int
    max_k: int
    q_valid: torch.Tensor  # [Tq] rows of the flat padded queries (and output) that are real, in packed order
    k_valid: torch.Tensor  # [Tk] rows of the flat padded keys that are real, in packed order
    mask: torch.Tensor | None  # [B, 1, max_q, max_k] bool, or None when plain causal suffices
    is_causal: bool


def prepare(plan: VarlenLayout, device: torch.device) -> SdpaState:
    B, max_q, max_k = plan.num_sequences, plan.max_q, plan.max_k
    q_valid, q_real = padding(plan.cu_q_list, max_q, device)
    k_valid, k_real = padding(plan.cu_k_list, max_k, device)
    if list(plan.lens_q) == list(plan.lens_k):
        # as many keys as queries in every sequence, padded at the end: a real query i sees exactly keys 0..i under
        # the plain causal mask, which lets the kernel skip the blocks above the diagonal (a mask would not)
        return SdpaState(B, max_q, max_k, q_valid, k_valid, None, True)
    iq = torch.arange(max_q, device=device)
    ik = torch.arange(max_k, device=device)
    offset = torch.tensor([lk - lq for lq, lk in zip(plan.lens_q, plan.lens_k)], device=device)[:, None, None]
    mask = (ik[None, None, :] <= iq[None, :, None] + offset) & k_real[:, None, :]
    mask = mask | ~q_real[:, :, None]
    return SdpaState(B, max_q, max_k, q_valid, k_valid, mask[:, None], False)


def padding(cu: list[int], length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """How packed rows (cu) go into a [B, length] padded batch: the flat padded slot of each packed row, in packed order
    ([T]), and which slots are real ([B, length])."""
    lengths = torch.tensor([b - a for a, b in zip(cu, cu[1:])], dtype=torch.int64, device=device)
    real = torch.arange(length, device=device)[None, :] < lengths[:, None]
    return real.reshape(-1).nonzero().squeeze(1), real


def pad(x: torch.Tensor, slots: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """[T, heads, hd] -> [B, heads, length, hd] with zero rows where a sequence is shorter: each packed row copied to
    its slot, so that the backward gathers the rows back (torch's backward of a gather on CPU scatters through an
    index expanded to the gradient's shape: docs/performance.md, 'Padding without scatters')."""
    x = x.new_zeros(batch * length, *x.shape[1:]).index_copy(0, slots, x)
    return x.view(batch, length, *x.shape[1:]).transpose(1, 2)


def unpad(x: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The rows `slots` (distinct) of x [B * length, ...], in order: `pad`'s inverse, its backward a `pad`."""
    return _TakeRows.apply(x, slots)


class _TakeRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(slots)
        ctx.rows = x.shape[0]
        return x.index_select(0, slots)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (slots,) = ctx.saved_tensors
        return grad.new_zeros(ctx.rows, *grad.shape[1:]).index_copy_(0, slots, grad), None


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: SdpaState, scale: float | None) -> torch.Tensor:
    qp = pad(q, s.q_valid, s.batch, s.max_q)
    kp = pad(k, s.k_valid, s.batch, s.max_k)
    vp = pad(v, s.k_valid, s.batch, s.max_k)
    groups = q.shape[1] // k.shape[1]
    if groups > 1 and not _HAS_ENABLE_GQA:
        kp, vp = kp.repeat_interleave(groups, dim=1), vp.repeat_interleave(groups, dim=1)
    kwargs = {"enable_gqa": True} if groups > 1 and _HAS_ENABLE_GQA else {}
    out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=s.mask, is_causal=s.is_causal, scale=scale, **kwargs)
    return unpad(out.transpose(1, 2).reshape(s.batch * s.max_q, *q.shape[1:]), s.q_valid)
