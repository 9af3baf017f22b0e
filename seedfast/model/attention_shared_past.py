"""Attention of sequences that share a past (docs/performance.md, 'Responses that share a teacher context').

Sequence b of a packed batch attends to all of past[owner[b]] and then causally to its own tokens: several
responses scored against one teacher context, with the context's keys and values held once instead of once per
response. It is exact: two attentions merged by their log-sum-exp,

    part 1  the rows of every sequence of one past against that past        (no mask: the past precedes them all)
    part 2  each sequence against its own tokens                            (causal)
    out     = (o1 · exp(lse1) + o2 · exp(lse2)) / (exp(lse1) + exp(lse2))

in fp32 at least, whatever the inputs' dtype. Part 1 is one pair of matmuls per past (its rows in blocks of
ROW_BLOCK), part 2 one padded batch; neither gathers a past's keys per sequence, which the varlen path
(PackedKV.select, then VarlenPlan) copies once per sequence and layer.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from .attention_sdpa import pad, padding

ROW_BLOCK = 1024  # rows of one past's queries per matmul: bounds the fp32 [heads, rows, past] scores held at once


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
        self.q_gather, q_real = padding(cu_q, self.max_q, device)
        self.valid = q_real.reshape(-1).nonzero().squeeze(1)
        self.k_gather, _ = padding(cu_k, self.max_k, device)
        offset = torch.tensor([k - q for k, q in zip(lens_k, lens_q)], device=device)[:, None, None]
        i, j = torch.arange(self.max_q, device=device), torch.arange(self.max_k, device=device)
        # [B, 1, 1, Lq, Lk]; a padded query row still sees key 0 (never a fully masked row)
        self.visible = (j[None, None, :] <= i[None, :, None] + offset)[:, None, None]

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor,
                 past_v: torch.Tensor, scale: float) -> torch.Tensor:
        """q [Tq, H, hd] (the querying rows), k/v [Tk, Hkv, hd] (every token of the sequences), past_k/past_v
        [Tp, Hkv, hd] -> [Tq, H, hd]."""
        if self.total_q == 0:
            return q.new_zeros(q.shape)
        heads, kv_heads, hd = q.shape[1], k.shape[1], q.shape[2]
        group = heads // kv_heads
        dtype = torch.promote_types(q.dtype, torch.float32)  # fp32 at least (bf16 inputs), fp64 stays fp64
        qf = q.to(dtype)
        o2, lse2 = self._own(qf, k.to(dtype), v.to(dtype), group, scale)
        if not self.rows_of_past:
            return o2.to(q.dtype)
        o1 = torch.zeros_like(o2)
        lse1 = torch.full_like(lse2, float("-inf"))
        for start, end, rows in self.rows_of_past:
            keys, values = past_k[start:end].to(dtype).transpose(0, 1), past_v[start:end].to(dtype).transpose(0, 1)
            for block in rows.split(ROW_BLOCK):
                n = len(block)
                # [n, H, hd] -> [Hkv, group * n, hd]: the query heads that read one key/value head, stacked
                qg = qf[block].view(n, kv_heads, group, hd).permute(1, 2, 0, 3).reshape(kv_heads, group * n, hd)
                o, lse_block = _softmax_attend(qg @ keys.transpose(1, 2) * scale, values)
                o1[block] = o.view(kv_heads, group, n, hd).permute(2, 0, 1, 3).reshape(n, heads, hd)
                lse1[block] = lse_block.view(kv_heads, group, n).permute(2, 0, 1).reshape(n, heads)
        lse = torch.logaddexp(lse1, lse2)
        return (o1 * torch.exp(lse1 - lse)[..., None] + o2 * torch.exp(lse2 - lse)[..., None]).to(q.dtype)

    def _own(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: int, scale: float
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """Part 2: each sequence's queries causally against its own tokens ([Tq, H, hd], and [Tq, H] log-sum-exps)."""
        heads, kv_heads, hd = q.shape[1], k.shape[1], q.shape[2]
        B, Lq, Lk = self.batch, self.max_q, self.max_k

        qp = pad(q, self.q_gather, B, Lq).reshape(B, kv_heads, group * Lq, hd)  # query heads under their kv head
        scores = (qp @ pad(k, self.k_gather, B, Lk).transpose(-1, -2) * scale).view(B, kv_heads, group, Lq, Lk)
        scores = scores.masked_fill(~self.visible, float("-inf")).view(B, kv_heads, group * Lq, Lk)
        o, lse = _softmax_attend(scores, pad(v, self.k_gather, B, Lk))
        o = o.view(B, heads, Lq, hd).transpose(1, 2).reshape(B * Lq, heads, hd)[self.valid]
        return o, lse.view(B, heads, Lq).transpose(1, 2).reshape(B * Lq, heads)[self.valid]


def _softmax_attend(scores: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scores) @ values and the log-sum-exp of each row of scores."""
    top = scores.amax(-1, keepdim=True)
    weights = torch.exp(scores - top)
    total = weights.sum(-1, keepdim=True)
    return (weights @ values) / total, (top + total.log()).squeeze(-1)
