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

from collections.abc import Sequence

import torch

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
        cu_q = [0]
        for n in lens_q:
            cu_q.append(cu_q[-1] + n)
        self.total_q, self.batch = cu_q[-1], len(lens_k)
        # part 1: each past's query rows (those of every sequence it owns)
        self.rows_of_past: list[tuple[int, int, torch.Tensor]] = []
        for g in range(n_past):
            rows = [t for b, o in enumerate(owner) if o == g for t in range(cu_q[b], cu_q[b + 1])]
            if rows and cu_past[g + 1] > cu_past[g]:
                self.rows_of_past.append((cu_past[g], cu_past[g + 1], torch.tensor(rows, device=device)))
        # part 2: queries padded to [B, Lq], keys to [B, Lk]; query i of sequence b is its token Lk_b - Lq_b + i
        self.max_q, self.max_k = max(lens_q, default=0), max(lens_k, default=0)
        self.q_gather, self.valid = _padding(cu_q, self.max_q, device)
        self.k_gather, _ = _padding(cu_k, self.max_k, device)
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

        def padded(x: torch.Tensor, gather: torch.Tensor, length: int) -> torch.Tensor:  # [T, h, hd] -> [B, h, L, hd]
            x = torch.cat([x, x.new_zeros(1, *x.shape[1:])])[gather]
            return x.view(B, length, *x.shape[1:]).transpose(1, 2)

        qp = padded(q, self.q_gather, Lq).reshape(B, kv_heads, group * Lq, hd)  # query heads under their kv head
        scores = (qp @ padded(k, self.k_gather, Lk).transpose(-1, -2) * scale).view(B, kv_heads, group, Lq, Lk)
        scores = scores.masked_fill(~self.visible, float("-inf")).view(B, kv_heads, group * Lq, Lk)
        o, lse = _softmax_attend(scores, padded(v, self.k_gather, Lk))
        o = o.view(B, heads, Lq, hd).transpose(1, 2).reshape(B * Lq, heads, hd)[self.valid]
        return o, lse.view(B, heads, Lq).transpose(1, 2).reshape(B * Lq, heads)[self.valid]


def _padding(cu: list[int], length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather indices from packed rows (cu) into [B, length] (the pad reads row cu[-1], a zero row appended), and the
    real rows of the flattened padded layout, in packed order."""
    lengths = torch.tensor([b - a for a, b in zip(cu, cu[1:])], dtype=torch.int64, device=device)
    i = torch.arange(length, device=device)
    real = i[None, :] < lengths[:, None]
    starts = torch.tensor(cu[:-1], dtype=torch.int64, device=device)[:, None]
    return torch.where(real, starts + i[None, :], cu[-1]).reshape(-1), real.reshape(-1).nonzero().squeeze(1)


def _softmax_attend(scores: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scores) @ values and the log-sum-exp of each row of scores."""
    top = scores.amax(-1, keepdim=True)
    weights = torch.exp(scores - top)
    total = weights.sum(-1, keepdim=True)
    return (weights @ values) / total, (top + total.log()).squeeze(-1)
