"""The torch backend's full-vocabulary divergences between a student and a teacher context (docs/algorithms.md, 'Forms
of the teacher term'; the protocol: seedfast/ops/divergence.py).

Both contexts' logits z = h·Wᵀ/T come from the same W and are never stored whole. The training path keeps blocks
of whole vocabulary rows (tiles [R, V]): both log-softmaxes are exact within the block, so the value and the
student's logits gradient come out of one pass — two GEMMs for the logits of both contexts, two for dh and dW, as
many as the materialized path. Where a block of whole rows does not fit its budget (or W is not fp32), the value is
streamed in vocabulary tiles: one pass for both log-normalizers, one for the sums, and the backward recomputes the
tiles.

Per row, with r = log p_t − log p_s (exactly 0 where the two contexts agree, so a student that equals its teacher
gets exactly 0 and a zero gradient):
    reverse_kl  D = Σ p_s·(−r)                          ∂D/∂z_s = p_s⊙(−r − D)
    forward_kl  D = Σ p_t·r                             ∂D/∂z_s = p_s − p_t
    jsd         log(p_s/M) = −log((1−β) + β·e^r) = q,  K = Σ p_s·q,  D = β·Σ p_t·(r + q) + (1−β)·K
                                                        ∂D/∂z_s = (1−β)·p_s⊙(q − K)
"""

from __future__ import annotations

import math
import os

import torch

from .row_stats import RowStats
from .tiles import tile_shape

KINDS = ("reverse_kl", "forward_kl", "jsd")

DIVERGENCE_BYTES_ENV = "SEEDFAST_OPS_DIVERGENCE_BYTES"
# Blocks of whole vocabulary rows hold two fp32 tiles [R, V]; 512 MiB gives R = 441 rows at V = 151,936 (Qwen2.5's
# head), a fifth of one materialized [4096, V] logits tensor; fewer, taller blocks add into dW fewer times.
DEFAULT_DIVERGENCE_BYTES = 512 << 20
LIVE_TILES = 2  # the block's log-probs of both contexts; elementwise temporaries are slices (_SLICE)
# Below this many rows a block's GEMMs are too short to pay for the whole-row pass (chunked.FUSED_MIN_ROWS's reason).
MIN_BLOCK_ROWS = 16
# e^r beyond e^80 makes (1 − β) vanish next to β·e^r in fp32: q = −(log β + r) there, without overflow.
_JSD_LINEAR_FROM = 80.0


def divergence_budget_bytes() -> int:
    raw = os.environ.get(DIVERGENCE_BYTES_ENV)
    if raw is None:
        return DEFAULT_DIVERGENCE_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{DIVERGENCE_BYTES_ENV} must be a positive integer number of bytes, got {raw!r}") from None
    if value < 4:
        raise ValueError(f"{DIVERGENCE_BYTES_ENV} must be at least 4 bytes, got {value}")
    return value


def block_rows(n_rows: int, vocab: int, weight_is_fp32: bool, budget_bytes: int) -> int:
    """Rows per block of whole vocabulary rows, or 0 when such a block does not pay (streamed tiles instead)."""
    if not weight_is_fp32:
        return 0
    rows = budget_bytes // (4 * LIVE_TILES * max(vocab, 1))
    if rows < min(MIN_BLOCK_ROWS, max(n_rows, 1)):
        return 0
    return max(1, min(max(n_rows, 1), rows))


def jsd_log_ratio(r: torch.Tensor, beta: float) -> torch.Tensor:
    """q = log(p_s / M) = −log((1−β) + β·e^r) for M = (1−β)·p_s + β·p_t and r = log p_t − log p_s; exactly 0 at
    r = 0."""
    linear = r > _JSD_LINEAR_FROM
    q = -torch.log1p(beta * torch.expm1(r.clamp(max=_JSD_LINEAR_FROM)))
    return torch.where(linear, -(math.log(beta) + r), q)


# Elementwise work on a block of whole vocabulary rows runs over slices of this many vocabulary entries, so its
# temporaries stay small beside the block itself.
_SLICE = 8192


def _slices(length: int, dim: int, step: int = _SLICE):
    for start in range(0, length, step):
        yield (slice(start, start + step),) if dim == 0 else (slice(None), slice(start, start + step))


def _tile_value(logp_s: torch.Tensor, logp_t: torch.Tensor, kind: str, beta: float, dim: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(value, center) summed over the vocabulary axis `dim` of both contexts' log-probs (inputs left as they are)."""
    value = center = None
    for part in _slices(logp_s.shape[dim], dim):
        ls, lt = logp_s[part], logp_t[part]
        r = lt - ls
        # p_t as exp(log p_t), never p_s·e^r: where the teacher puts mass on an entry the student gives ~0, r passes
        # 88.7 nats and e^r is inf in fp32 (p_s·e^r inf or 0·inf = NaN); the Triton kernels do the same.
        if kind == "reverse_kl":
            v, c = -(ls.exp() * r).sum(dim), None
        elif kind == "forward_kl":
            v, c = (lt.exp() * r).sum(dim), None
        else:
            q = jsd_log_ratio(r, beta)
            c = (ls.exp() * q).sum(dim)
            v = beta * (lt.exp() * (r + q)).sum(dim) + (1.0 - beta) * c
        value = v if value is None else value + v
        if c is not None:
            center = c if center is None else center + c
    if kind == "reverse_kl":
        return value, value
    return value, torch.zeros_like(value) if kind == "forward_kl" else center


def _tile_grad_(logp_s: torch.Tensor, logp_t: torch.Tensor, center: torch.Tensor, coef: torch.Tensor, kind: str,
                beta: float, dim: int) -> torch.Tensor:
    """coef·∂D/∂z_s, written into logp_s (logp_t is left as it is); center and coef are per row [R], broadcast along
    the vocabulary axis `dim`."""
    center = center.unsqueeze(dim)
    coef = coef.unsqueeze(dim) * (1.0 - beta) if kind == "jsd" else coef.unsqueeze(dim)
    for part in _slices(logp_s.shape[dim], dim):
        ls = logp_s[part]
        if kind == "forward_kl":  # p_s − p_t, not p_s⊙(1 − e^r): e^r overflows fp32 in the far tail (_tile_value)
            p_s = ls.exp_().sub_(logp_t[part].exp())
        else:
            r = logp_t[part] - ls
            p_s = ls.exp_()
            if kind == "reverse_kl":
                p_s.mul_(r.add_(center).neg_())
            else:
                p_s.mul_(jsd_log_ratio(r, beta).sub_(center))
        p_s.mul_(coef)
    return logp_s


def _log_softmax_rows_(logits: torch.Tensor) -> torch.Tensor:
    """Log-softmax along the rows of an [R, V] block, in place on CPU (no third tile)."""
    if logits.device.type == "cpu":
        return torch.log_softmax(logits, dim=1, out=logits)
    return torch.log_softmax(logits, dim=1)


def _reverse_kl_block_(logp_s: torch.Tensor, logp_t: torch.Tensor, coef: torch.Tensor, want_grad: bool
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(D [R], coef·∂D/∂z_s [R, V] | None) of the reverse KL for a block of whole rows, in place in both tiles and
    without temporaries: q = p_s·r gives D = −Σq, and coef·p_s⊙(−r − D) = −coef·(q + D·p_s)."""
    q = logp_t.sub_(logp_s)
    p_s = logp_s.exp_()
    q.mul_(p_s)
    value = -q.sum(1)
    if not want_grad:
        return value, None
    return value, p_s.mul_(value.unsqueeze(1)).add_(q).mul_(-coef.unsqueeze(1))


def _active_rows(active: torch.Tensor) -> torch.Tensor | None:
    return None if bool(active.all()) else active.nonzero().squeeze(1)


def _blocks(n: int, rows_index: torch.Tensor | None, rows: int):
    count = n if rows_index is None else rows_index.numel()
    for start in range(0, count, rows):
        stop = min(start + rows, count)
        yield slice(start, stop) if rows_index is None else rows_index[start:stop]


def _scaled(x: torch.Tensor, sel, scale: float) -> torch.Tensor:
    rows = x[sel].float()
    return rows * scale if scale != 1.0 else rows


def _tiled_plan(count: int, weight: torch.Tensor) -> tuple[int, int]:
    from .tiles import tile_budget_bytes

    return tile_shape(count, weight.shape[0], weight.shape[1], weight.dtype != torch.float32, tile_budget_bytes(),
                      live_tiles=2)


def _log_normalizers(hidden, teacher_hidden, weight, sel, scale, cols) -> tuple[torch.Tensor, torch.Tensor]:
    h, ht = _scaled(hidden, sel, scale), _scaled(teacher_hidden, sel, scale)
    device, n = hidden.device, h.shape[0]
    student, teacher = RowStats(n, device, False), RowStats(n, device, False)
    no_target = torch.full((n,), -1, dtype=torch.long, device=device)
    for start in range(0, weight.shape[0], cols):
        w = weight[start:start + cols].float()
        student.update(torch.mm(h, w.t()), no_target)
        teacher.update(torch.mm(ht, w.t()), no_target)
    return student.logsumexp(), teacher.logsumexp()


def _tiled_sums(hidden, teacher_hidden, weight, sel, scale, cols, lse, teacher_lse, kind, beta):
    h, ht = _scaled(hidden, sel, scale), _scaled(teacher_hidden, sel, scale)
    value = torch.zeros(h.shape[0], dtype=torch.float32, device=h.device)
    center = torch.zeros_like(value)
    for start in range(0, weight.shape[0], cols):
        w = weight[start:start + cols].float()
        logp_s = torch.mm(h, w.t()).sub_(lse[:, None])
        logp_t = torch.mm(ht, w.t()).sub_(teacher_lse[:, None])
        v, c = _tile_value(logp_s, logp_t, kind, beta, dim=1)
        value += v
        center += c
    return value, center


def divergence_forward(hidden: torch.Tensor, teacher_hidden: torch.Tensor, weight: torch.Tensor,
                       active: torch.Tensor, *, kind: str, beta: float, temperature: float
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(value D, center, lse, teacher_lse), all [N] fp32 and 0 on rows that are not `active`; streamed tiles."""
    n = hidden.shape[0]
    out = [torch.zeros(n, dtype=torch.float32, device=hidden.device) for _ in range(4)]
    index = _active_rows(active)
    count = n if index is None else index.numel()
    rows, cols = _tiled_plan(count, weight)
    scale = 1.0 / temperature
    for sel in _blocks(n, index, rows):
        lse, teacher_lse = _log_normalizers(hidden, teacher_hidden, weight, sel, scale, cols)
        value, center = _tiled_sums(hidden, teacher_hidden, weight, sel, scale, cols, lse, teacher_lse, kind, beta)
        for dst, src in zip(out, (value, center, lse, teacher_lse)):
            dst[sel] = src
    return tuple(out)


def divergence_partial(hidden: torch.Tensor, teacher_hidden: torch.Tensor, weight: torch.Tensor,
                       active: torch.Tensor, lse: torch.Tensor, teacher_lse: torch.Tensor, *, kind: str, beta: float,
                       temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(value, center) summed over this weight's vocabulary rows only, under the given (global) log-normalizers."""
    n = hidden.shape[0]
    value = torch.zeros(n, dtype=torch.float32, device=hidden.device)
    center = torch.zeros_like(value)
    index = _active_rows(active)
    count = n if index is None else index.numel()
    rows, cols = _tiled_plan(count, weight)
    scale = 1.0 / temperature
    for sel in _blocks(n, index, rows):
        v, c = _tiled_sums(hidden, teacher_hidden, weight, sel, scale, cols, lse[sel].float(),
                           teacher_lse[sel].float(), kind, beta)
        value[sel], center[sel] = v, c
    return value, center


def divergence_backward(hidden: torch.Tensor, teacher_hidden: torch.Tensor, weight: torch.Tensor,
                        lse: torch.Tensor, teacher_lse: torch.Tensor, center: torch.Tensor, coef: torch.Tensor, *,
                        kind: str, beta: float, temperature: float, need_hidden_grad: bool = True,
                        need_weight_grad: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """∂(Σ_t coef_t·D_t)/∂(hidden, weight) from recomputed tiles; rows with coef 0 contribute exactly 0."""
    n, (vocab, d) = hidden.shape[0], weight.shape
    if not (need_hidden_grad or need_weight_grad):
        return None, None
    grad_hidden = torch.zeros_like(hidden, memory_format=torch.contiguous_format) if need_hidden_grad else None
    grad_weight = torch.zeros(vocab, d, dtype=torch.float32, device=weight.device) if need_weight_grad else None
    index = _active_rows(coef != 0)
    count = n if index is None else index.numel()
    rows, cols = _tiled_plan(count, weight)
    scale = 1.0 / temperature
    for sel in _blocks(n, index, rows):
        h, ht = _scaled(hidden, sel, scale), _scaled(teacher_hidden, sel, scale)
        block_lse, block_tlse = lse[sel].float()[:, None], teacher_lse[sel].float()[:, None]
        block_center, block_coef = center[sel].float(), coef[sel].float()
        dh = torch.zeros(h.shape, dtype=torch.float32, device=h.device) if grad_hidden is not None else None
        for start in range(0, vocab, cols):
            w = weight[start:start + cols].float()
            grad = _tile_grad_(torch.mm(h, w.t()).sub_(block_lse), torch.mm(ht, w.t()).sub_(block_tlse),
                               block_center, block_coef, kind, beta, dim=1)
            if dh is not None:
                dh.addmm_(grad, w)
            if grad_weight is not None:
                grad_weight[start:start + cols].addmm_(grad.t(), h)
            del grad
        if grad_hidden is not None:
            grad_hidden[sel] = dh.mul_(scale).to(hidden.dtype)
    return grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype)


def divergence_forward_backward(hidden: torch.Tensor, teacher_hidden: torch.Tensor, weight: torch.Tensor,
                                coef: torch.Tensor, *, kind: str, beta: float, temperature: float,
                                need_hidden_grad: bool = True, need_weight_grad: bool = True
                                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(value D [N] fp32, grad_hidden, grad_weight) of Σ_t coef_t·D_t in one pass over blocks of whole vocabulary
    rows; rows with coef 0 are skipped (value 0). Streams tiles (forward, then backward) where such blocks do not
    fit."""
    n, (vocab, d) = hidden.shape[0], weight.shape
    index = _active_rows(coef != 0)
    count = n if index is None else index.numel()
    rows = block_rows(count, vocab, weight.dtype == torch.float32, divergence_budget_bytes())
    if rows == 0:
        value, center, lse, teacher_lse = divergence_forward(hidden, teacher_hidden, weight, coef != 0, kind=kind,
                                                             beta=beta, temperature=temperature)
        grads = divergence_backward(hidden, teacher_hidden, weight, lse, teacher_lse, center, coef, kind=kind,
                                    beta=beta, temperature=temperature, need_hidden_grad=need_hidden_grad,
                                    need_weight_grad=need_weight_grad)
        return value, *grads

    device, scale = hidden.device, 1.0 / temperature
    value = torch.zeros(n, dtype=torch.float32, device=device)
    grad_hidden = torch.zeros_like(hidden, memory_format=torch.contiguous_format) if need_hidden_grad else None
    grad_weight = torch.zeros(vocab, d, dtype=torch.float32, device=device) if need_weight_grad else None
    for sel in _blocks(n, index, rows):
        h = _scaled(hidden, sel, scale)
        # Blocks [R, V], each context its own GEMM and log-softmax of one shape: a row's numbers then never depend
        # on its position (vector lanes, tails), so a student equal to its teacher gives exactly 0; and torch's CPU
        # log-softmax along the contiguous axis is both faster and ~20x more accurate than down the columns of
        # [V, R] (its normalizer off by 2.5e-4 at V = 151,936: docs/performance.md, 'Full-vocabulary divergences
        # without logits').
        logp_s = _log_softmax_rows_(torch.mm(h, weight.t()))
        logp_t = _log_softmax_rows_(torch.mm(_scaled(teacher_hidden, sel, scale), weight.t()))
        want_grad = grad_hidden is not None or grad_weight is not None
        if kind == "reverse_kl":
            block_value, grad = _reverse_kl_block_(logp_s, logp_t, coef[sel].float(), want_grad)
        else:
            block_value, block_center = _tile_value(logp_s, logp_t, kind, beta, dim=1)
            grad = _tile_grad_(logp_s, logp_t, block_center, coef[sel].float(), kind, beta, dim=1) if want_grad \
                else None
        value[sel] = block_value
        if grad is None:
            continue
        if grad_hidden is not None:
            grad_hidden[sel] = torch.mm(grad, weight).mul_(scale).to(hidden.dtype)
        if grad_weight is not None:
            grad_weight.addmm_(grad.t(), h)
        del logp_s, logp_t, grad
    return value, grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype)
