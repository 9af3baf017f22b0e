"""The torch backend of seedfast.ops (the reference implementation; CPU and any device).

Logits are computed one tile (row block × vocabulary tile, sized by tiles.py) at a time in fp32 and
never stored: the forward keeps per-row online statistics, the backward recomputes each tile and turns
it into ∂L/∂z = a·(onehot − p) + b·(−p⊙(log p + H)) in place (docs/algorithms.md, 'Gradient with respect to the
logits'). Rows whose target is
`ignore_index` are skipped entirely. With z = h·Wᵀ/T the temperature is folded into the hidden rows.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from seedfast.algo.losses import LossOptions

from .chunked_divergence import (
    divergence_backward,
    divergence_forward,
    divergence_forward_backward,
    divergence_partial,
)
from .row_stats import RowStats, in_tile
from .tiles import fused_rows, tile_budget_bytes, tile_shape
from .token_loss import merge_metric_sums, token_loss
from .validate import check_target_range

__all__ = ["backward", "divergence_backward", "divergence_forward", "divergence_forward_backward", "divergence_partial",
           "forward", "fused_forward_backward", "token_loss"]

Rows = slice | torch.Tensor


def _valid_rows(targets: torch.Tensor, ignore_index: int) -> torch.Tensor | None:
    """Indices of rows to compute, or None when every row counts (then blocks are cheap slices)."""
    valid = targets != ignore_index
    if bool(valid.all()):
        return None
    return valid.nonzero().squeeze(1)


def _row_blocks(n: int, valid: torch.Tensor | None, rows: int) -> Iterator[Rows]:
    count = n if valid is None else valid.numel()
    for start in range(0, count, rows):
        stop = min(start + rows, count)
        yield slice(start, stop) if valid is None else valid[start:stop]


def _block_len(sel: Rows) -> int:
    return sel.stop - sel.start if isinstance(sel, slice) else sel.numel()


def _scaled_rows(x: torch.Tensor, sel: Rows, scale: float) -> torch.Tensor:
    rows = x[sel].float()
    return rows * scale if scale != 1.0 else rows


def _weight_tile(weight: torch.Tensor, start: int, cols: int) -> torch.Tensor:
    return weight[start:start + cols].float()


def _plan(targets: torch.Tensor, ignore_index: int, weight: torch.Tensor, live_tiles: int
          ) -> tuple[torch.Tensor | None, int, int]:
    valid = _valid_rows(targets, ignore_index)
    count = targets.numel() if valid is None else valid.numel()
    rows, cols = tile_shape(count, weight.shape[0], weight.shape[1], weight.dtype != torch.float32,
                            tile_budget_bytes(), live_tiles)
    return valid, rows, cols


def forward(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
            teacher_hidden: torch.Tensor | None, temperature: float, with_entropy: bool, ignore_index: int,
            *, check_targets: bool = True
            ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """(logprob, entropy | None, teacher_logprob | None, lse), all [N] fp32; ignored rows hold 0.

    check_targets=False skips the target-range check (one host sync) for callers that already ran it:
    the public ops, via validate.check_linear_inputs."""
    n, vocab, device = hidden.shape[0], weight.shape[0], hidden.device
    if check_targets:
        check_target_range("forward", targets, vocab, ignore_index)
    logprob = torch.zeros(n, dtype=torch.float32, device=device)
    lse = torch.zeros_like(logprob)
    entropy = torch.zeros_like(logprob) if with_entropy else None
    teacher_logprob = torch.zeros_like(logprob) if teacher_hidden is not None else None
    valid, rows, cols = _plan(targets, ignore_index, weight, live_tiles=2 if with_entropy else 1)
    scale = 1.0 / temperature

    for sel in _row_blocks(n, valid, rows):
        y = targets[sel]
        h = _scaled_rows(hidden, sel, scale)
        stats = RowStats(_block_len(sel), device, with_entropy)
        teacher_h = None if teacher_hidden is None else _scaled_rows(teacher_hidden, sel, scale)
        teacher_stats = None if teacher_h is None else RowStats(_block_len(sel), device, False)
        for start in range(0, vocab, cols):
            w = _weight_tile(weight, start, cols)  # read once for both contexts
            stats.update(torch.mm(h, w.t()), y - start)
            if teacher_stats is not None:
                teacher_stats.update(torch.mm(teacher_h, w.t()), y - start)
        block_lse = stats.logsumexp()
        lse[sel] = block_lse
        logprob[sel] = stats.target - block_lse
        if entropy is not None:
            entropy[sel] = stats.entropy()
        if teacher_stats is not None:
            teacher_logprob[sel] = teacher_stats.target - teacher_stats.logsumexp()
    return logprob, entropy, teacher_logprob, lse


def _minus_softmax_terms_(probs: torch.Tensor, logp: torch.Tensor | None, entropy: torch.Tensor | None,
                          a: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """−a·p − b·p⊙(log p + H), written into `logp` (or `probs` when b is None); the per-token a, b, H come
    already shaped to broadcast against the tile (rows down dim 0 or along dim 1)."""
    if b is None:
        return probs.mul_(-a)
    return logp.add_(entropy).mul_(b).add_(a).mul_(probs).neg_()


def _logits_grad_(probs: torch.Tensor, logp: torch.Tensor | None, entropy: torch.Tensor | None,
                  a: torch.Tensor, b: torch.Tensor | None, local_targets: torch.Tensor) -> torch.Tensor:
    """∂L/∂z = a·(onehot − p) − b·p⊙(log p + H) for a [rows, cols] vocabulary tile, written in place."""
    grad = _minus_softmax_terms_(probs, logp, None if entropy is None else entropy.unsqueeze(1), a.unsqueeze(1),
                                 None if b is None else b.unsqueeze(1))
    inside, col = in_tile(local_targets, grad.shape[1])
    grad.scatter_add_(1, col.unsqueeze(1), torch.where(inside, a, 0.0).unsqueeze(1))
    return grad


def backward(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor,
             entropy: torch.Tensor | None, grad_logprob: torch.Tensor, grad_entropy: torch.Tensor | None,
             temperature: float, ignore_index: int, *, need_hidden_grad: bool = True, need_weight_grad: bool = True
             ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(grad_hidden in hidden.dtype, grad_weight in weight.dtype); dW and dh accumulate in fp32.

    A gradient that is not needed (need_*_grad=False, e.g. a frozen LM head) is returned as None and its
    GEMM is never run; with neither needed nothing is computed."""
    if grad_entropy is not None and entropy is None:
        raise ValueError("backward: grad_entropy was given but entropy is None (entropy was not computed)")
    n, (vocab, d) = hidden.shape[0], weight.shape
    if not (need_hidden_grad or need_weight_grad):
        return None, None
    grad_hidden = torch.zeros_like(hidden, memory_format=torch.contiguous_format) if need_hidden_grad else None
    grad_weight = torch.zeros(vocab, d, dtype=torch.float32, device=weight.device) if need_weight_grad else None
    valid, rows, cols = _plan(targets, ignore_index, weight, live_tiles=1 if grad_entropy is None else 2)
    scale = 1.0 / temperature

    for sel in _row_blocks(n, valid, rows):
        y = targets[sel]
        h = _scaled_rows(hidden, sel, scale)
        a = grad_logprob[sel].float()
        b = None if grad_entropy is None else grad_entropy[sel].float()
        block_lse = lse[sel]
        block_h = None if b is None else entropy[sel]
        dh = torch.zeros(h.shape, dtype=torch.float32, device=h.device) if need_hidden_grad else None
        for start in range(0, vocab, cols):
            w = _weight_tile(weight, start, cols)
            logp = torch.mm(h, w.t()).sub_(block_lse.unsqueeze(1))
            probs = logp.exp_() if b is None else torch.exp(logp)
            grad = _logits_grad_(probs, logp, block_h, a, b, y - start)
            if dh is not None:
                dh.addmm_(grad, w)
            if grad_weight is not None:
                grad_weight[start:start + cols].addmm_(grad.t(), h)
            del logp, probs, grad  # free this tile before the next one is allocated: one tile alive, not two
        if grad_hidden is not None:
            grad_hidden[sel] = dh.mul_(scale).to(hidden.dtype)
    return grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype)


def _log_softmax_(logits: torch.Tensor, dim: int) -> torch.Tensor:
    """Log-softmax along `dim`; in place on CPU, where the fused kernel finishes each row (column) while it
    is in cache: one pass instead of the max / subtract / exp / sum / divide sequence over the whole tile."""
    if logits.device.type == "cpu":
        return torch.log_softmax(logits, dim=dim, out=logits)
    return torch.log_softmax(logits, dim=dim)


def _column_dot(x: torch.Tensor, y: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    """Σ_v x[v, i]·y[v, i] per column, with product temporaries of at most `chunk` rows."""
    out = torch.zeros(x.shape[1], dtype=torch.float32, device=x.device)
    for start in range(0, x.shape[0], chunk):
        out += (x[start:start + chunk] * y[start:start + chunk]).sum(dim=0)
    return out


def _logits_grad_columns_(probs: torch.Tensor, logp: torch.Tensor | None, entropy: torch.Tensor | None,
                          a: torch.Tensor, b: torch.Tensor | None, targets: torch.Tensor,
                          cols: torch.Tensor) -> torch.Tensor:
    """_logits_grad_ for a transposed [V, rows] tile holding whole vocabulary columns."""
    grad = _minus_softmax_terms_(probs, logp, entropy, a, b)
    return grad.index_put_((targets, cols), a, accumulate=True)


def _take(per_token: dict[str, torch.Tensor | None], sel: Rows) -> dict[str, torch.Tensor | None]:
    return {name: None if t is None else t[sel] for name, t in per_token.items()}


def fused_forward_backward(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                           temperature: float, ignore_index: int, with_entropy: bool,
                           per_token: dict[str, torch.Tensor | None], options: LossOptions,
                           need_hidden_grad: bool = True, need_weight_grad: bool = True
                           ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None, torch.Tensor | None,
                                      torch.Tensor]:
    """Loss, metric sums, both gradients and the [N] log-probs (0 on ignored rows) in one streamed pass:
    per row block of whole vocabulary rows, three matmuls (logits, dh, dW) instead of the four of forward + backward.
    A gradient with need_*_grad=False is None and its matmul is skipped (a frozen LM head: two matmuls).

    `per_token` holds the [N] inputs of token_loss (old_logprob, ref_logprob, teacher_logprob,
    teacher_mask, advantages, token_weights), `options` its loss options. Rows with ignored
    targets must carry token weight 0. Falls back to forward → token_loss → backward when a block of
    whole rows would be too small for the memory budget (or the weight needs an fp32 copy).
    """
    n, (vocab, d) = hidden.shape[0], weight.shape
    valid = _valid_rows(targets, ignore_index)
    count = n if valid is None else valid.numel()
    rows = fused_rows(count, vocab, weight.dtype != torch.float32, tile_budget_bytes(), 2 if with_entropy else 1)
    if rows == 0:
        return _three_step(hidden, weight, targets, temperature, ignore_index, with_entropy, per_token, options,
                           need_hidden_grad, need_weight_grad)

    device = hidden.device
    grad_hidden = torch.zeros_like(hidden, memory_format=torch.contiguous_format) if need_hidden_grad else None
    grad_weight = torch.zeros(vocab, d, dtype=torch.float32, device=device) if need_weight_grad else None
    loss = torch.zeros((), dtype=torch.float32, device=device)
    all_logprob = torch.zeros(n, dtype=torch.float32, device=device)
    sums: dict[str, torch.Tensor] = {}
    scale = 1.0 / temperature
    w = weight.float()

    for sel in _row_blocks(n, valid, rows):
        y = targets[sel]
        h = _scaled_rows(hidden, sel, scale)
        # The tile is held transposed, [V, rows]: W·hᵀ, the backward GEMMs Wᵀ-free (gradᵀ·W and grad·h)
        # and the log-softmax down the columns run ~10% faster on CPU than the [rows, V] layout.
        logp = _log_softmax_(torch.mm(w, h.t()), dim=0)
        cols = torch.arange(h.shape[0], device=device)
        logprob = logp[y, cols]
        all_logprob[sel] = logprob
        probs = logp.exp_() if not with_entropy else torch.exp(logp)
        entropy = -_column_dot(probs, logp) if with_entropy else None

        block_loss, a, b, block_sums = token_loss(logprob, entropy, **_take(per_token, sel), options=options)
        loss += block_loss
        sums = merge_metric_sums(sums, block_sums)

        if grad_hidden is None and grad_weight is None:
            del logp, probs
            continue
        grad = _logits_grad_columns_(probs, logp if with_entropy else None, entropy, a, b, y, cols)
        if grad_hidden is not None:
            grad_hidden[sel] = torch.mm(grad.t(), w).mul_(scale).to(hidden.dtype)
        if grad_weight is not None:
            grad_weight.addmm_(grad, h)
        del logp, probs, grad  # free this tile before the next one is allocated: one tile alive, not two

    if not sums:  # no valid row: still report the (empty) metric sums
        _, _, _, sums = token_loss(torch.zeros(0, device=device), None, **_take(per_token, slice(0, 0)),
                                   options=options)
    return (loss, sums, grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype),
            all_logprob)


def _three_step(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
                ignore_index: int, with_entropy: bool, per_token: dict[str, torch.Tensor | None],
                options: LossOptions, need_hidden_grad: bool, need_weight_grad: bool
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None, torch.Tensor | None,
                           torch.Tensor]:
    # Targets are not range-checked here, as in the single pass: the callers (the public ops) have done it.
    logprob, entropy, _, lse = forward(hidden, weight, targets, None, temperature, with_entropy, ignore_index,
                                       check_targets=False)
    loss, a, b, sums = token_loss(logprob, entropy, **per_token, options=options)
    grad_hidden, grad_weight = backward(hidden, weight, targets, lse, entropy, a, b, temperature, ignore_index,
                                        need_hidden_grad=need_hidden_grad, need_weight_grad=need_weight_grad)
    return loss, sums, grad_hidden, grad_weight, logprob
