"""Attention of sequences that share a past (docs/performance.md, 'Responses that share a teacher context').

Sequence b of a packed batch attends to all of past[owner[b]] and then causally to its own tokens: several
responses scored against one teacher context, with the context's keys and values held once instead of once per
response. It is exact: two attentions merged by their log-sum-exp,

    part 1  the rows of every sequence of one past against that past        (no mask: the past precedes them all)
    part 2  each sequence against its own tokens                            (causal)
    out     = (o1 · exp(lse1) + o2 · exp(lse2)) / (exp(lse1) + exp(lse2))

in fp32 at least, whatever the inputs' dtype. Part 1 is one attention per past (its rows in blocks of ROW_BLOCK),
part 2 one padded batch; neither gathers a past's keys per sequence, which the varlen path (PackedKV.select, then
VarlenPlan) copies once per sequence and layer.

On CPU both parts run torch's fused flash kernel, which returns the log-sum-exp the merge needs and reads grouped
key/value heads in place; part 2 is plain causal there (every sequence as many keys as queries, padded at the end),
so the kernel skips the blocks above the diagonal. Elsewhere both run unfused, the scores in memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from .attention_sdpa import pad, padding, unpad

ROW_BLOCK = 1024  # rows of one past's queries per call: bounds the [heads, rows, past] scores of the unfused form

# the CPU flash kernel with its log-sum-exp (F.scaled_dot_product_attention drops it): q [B, H, M, hd], k/v
# [B, Hkv, N, hd] with Hkv dividing H (strided views are fine), is_causal top-left, an additive mask of q's dtype
# -> (out [B, H, M, hd], lse [B, H, M])
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def fused(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether shared-past attention runs fused for inputs on `device` in `dtype` (its compute dtype: fp32 at least),
    its own part causal without scores in memory."""
    compute = torch.promote_types(dtype, torch.float32)
    return _FLASH_CPU is not None and torch.device(device).type == "cpu" and compute in (torch.float32, torch.float64)


class SharedPastPlan:
    """The queries of B packed sequences (tokens cu_k) against a PackedKV-style past of G sequences (cu_past) and
    their own keys; sequence b reads past owner[b]. With `keep_last`, only the last keep_last[b] tokens of sequence b
    query (the decoder's last layer, model/decoder.py keep_last), each seeing what it sees in the full forward.
    Built once per forward, reused by every layer."""

    def __init__(self, cu_k: Sequence[int], cu_past: Sequence[int], owner: Sequence[int], device: torch.device,
                 keep_last: Sequence[int] | None = None) -> None:
        cu_k, cu_past = list(cu_k), list(cu_past)
        n_past = len(cu_past) - 1
        owner = [int(o) for o in owner]
        if len(owner) != len(cu_k) - 1:
            raise ValueError(f"past_owner has {len(owner)} entries for {len(cu_k) - 1} sequences")
        bad = [b for b, o in enumerate(owner) if not 0 <= o < n_past]
        if bad:
            raise ValueError(f"past_owner[{bad[0]}]={owner[bad[0]]} must lie in [0, {n_past}) (the past's sequences)")
        lens_k = [b - a for a, b in zip(cu_k, cu_k[1:])]
        lens_q = lens_k if keep_last is None else [int(n) for n in keep_last]
        cu_q = [0, *itertools.accumulate(lens_q)]
        self.total_q, self.batch = cu_q[-1], len(lens_k)
        # part 1: each past's query rows (those of every sequence it owns), in one pass over the sequences
        rows_of: dict[int, list[int]] = {}
        for b, g in enumerate(owner):
            rows_of.setdefault(g, []).extend(range(cu_q[b], cu_q[b + 1]))
        self.rows_of_past: list[tuple[int, int, torch.Tensor]] = [
            (cu_past[g], cu_past[g + 1], torch.tensor(rows, device=device))
            for g, rows in sorted(rows_of.items()) if rows and cu_past[g + 1] > cu_past[g]]
        # part 2: queries padded to [B, Lq], keys to [B, Lk]; query i of sequence b is its token Lk_b - Lq_b + i
        self.max_q, self.max_k = max(lens_q, default=0), max(lens_k, default=0)
        self.valid, _ = padding(cu_q, self.max_q, device)
        self.k_slots, _ = padding(cu_k, self.max_k, device)
        # with as many queries as keys in every sequence, padded at the end, a real query i sees exactly keys 0..i
        # under the plain causal mask (a padded query sees key 0 at least, and its output is dropped)
        self.causal = lens_q == lens_k
        self.visible = None
        if not self.causal:
            offset = torch.tensor([k - q for k, q in zip(lens_k, lens_q)], device=device)[:, None, None]
            i, j = torch.arange(self.max_q, device=device), torch.arange(self.max_k, device=device)
            self.visible = (j[None, None, :] <= i[None, :, None] + offset)[:, None]  # [B, 1, Lq, Lk]
        self._bias: dict[torch.dtype, torch.Tensor] = {}

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor,
                 past_v: torch.Tensor, scale: float) -> torch.Tensor:
        """q [Tq, H, hd] (the querying rows), k/v [Tk, Hkv, hd] (every token of the sequences), past_k/past_v
        [Tp, Hkv, hd] -> [Tq, H, hd]."""
        if self.total_q == 0:
            return q.new_zeros(q.shape)
        dtype = torch.promote_types(q.dtype, torch.float32)  # fp32 at least (bf16 inputs), fp64 stays fp64
        qf = q.to(dtype)
        o2, lse2 = self._own(qf, k.to(dtype), v.to(dtype), scale)
        if not self.rows_of_past:
            return o2.to(q.dtype)
        o1 = torch.zeros_like(o2)
        lse1 = torch.full_like(lse2, float("-inf"))
        for start, end, rows in self.rows_of_past:
            keys = past_k[start:end].to(dtype).transpose(0, 1)[None]  # [1, Hkv, past, hd], a view for fp32/fp64
            values = past_v[start:end].to(dtype).transpose(0, 1)[None]
            for block in rows.split(ROW_BLOCK):
                o, lse_block = _attend(qf[block].transpose(0, 1)[None], keys, values, scale)
                o1[block] = o[0].transpose(0, 1)
                lse1[block] = lse_block[0].transpose(0, 1)
        lse = torch.logaddexp(lse1, lse2)
        return (o1 * torch.exp(lse1 - lse)[..., None] + o2 * torch.exp(lse2 - lse)[..., None]).to(q.dtype)

    def _own(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """Part 2: each sequence's queries causally against its own tokens ([Tq, H, hd], and [Tq, H] log-sum-exps)."""
        heads, hd = q.shape[1], q.shape[2]
        B, Lq, Lk = self.batch, self.max_q, self.max_k
        o, lse = _attend(pad(q, self.valid, B, Lq), pad(k, self.k_slots, B, Lk), pad(v, self.k_slots, B, Lk),
                         scale, causal=self.causal, bias=None if self.causal else self._mask(q.dtype))
        return (unpad(o.transpose(1, 2).reshape(B * Lq, heads, hd), self.valid),
                unpad(lse.transpose(1, 2).reshape(B * Lq, heads), self.valid))

    def _mask(self, dtype: torch.dtype) -> torch.Tensor:
        """Part 2's bottom-right causal mask (kept rows: fewer queries than keys) as an additive bias [B, 1, Lq, Lk]
        of 0 and -inf, made once per forward and dtype and used by every layer."""
        if dtype not in self._bias:
            self._bias[dtype] = torch.zeros(self.visible.shape, dtype=dtype, device=self.visible.device).masked_fill(
                ~self.visible, float("-inf"))
        return self._bias[dtype]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool = False,
            bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ · scale + mask) v and each row's log-sum-exp: q [B, H, M, hd], k/v [B, Hkv, N, hd] (query head h
    reads key/value head h // (H / Hkv)), the mask top-left causal or an additive `bias` [B, 1, M, N]."""
    if fused(q.device, q.dtype):
        out, lse = _FLASH_CPU(q, k, v, is_causal=causal, attn_mask=bias, scale=scale)
        return out, lse.to(q.dtype)
    B, heads, M, hd = q.shape
    kv_heads, N = k.shape[1], k.shape[2]
    group = heads // kv_heads
    # the query heads that read one key/value head, stacked: [B, Hkv, group * M, hd]
    scores = (q.reshape(B, kv_heads, group * M, hd) @ k.transpose(-1, -2) * scale).view(B, kv_heads, group, M, N)
    if causal:
        scores = scores.masked_fill(torch.ones(M, N, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    if bias is not None:
        scores = scores + bias[:, :, None]
    o, lse = _softmax_attend(scores.view(B, kv_heads, group * M, N), v)
    return o.view(B, heads, M, hd), lse.view(B, heads, M)


def _softmax_attend(scores: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scores) @ values and the log-sum-exp of each row of scores."""
    top = scores.amax(-1, keepdim=True)
    weights = torch.exp(scores - top)
    total = weights.sum(-1, keepdim=True)
    return (weights @ values) / total, (top + total.log()).squeeze(-1)
