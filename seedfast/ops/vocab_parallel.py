"""Linear log-probs with the LM head sharded over the vocabulary (tensor parallel over V).

Each rank of `group` holds rows [vocab_start, vocab_start + V_local) of W and the same (replicated) hidden
rows. Forward: every rank runs any backend's forward on its shard (so the Triton kernel on CUDA), then
    lse = logsumexp_r(lse_r)                        (all-reduce max, then sum)
    ℓ   = z_y - lse                                 (z_y from the one rank that owns y: all-reduce sum)
    H   = Σ_r w_r·(H_r - log w_r),  w_r = exp(lse_r - lse)   (all-reduce sum)
Backward: each rank's backend backward with the global lse and H gives exactly its slice of
∂L/∂z = a·(onehot - p) + b·(-p⊙(log p + H)); dW stays local, dH is all-reduced (sum over shards).

The backend protocol computes a target term for every row; rows whose target lives on another rank are
given local column 0 as a stand-in, and that column's contribution is recomputed exactly here
(O(N·d), no vocabulary-sized work).

No training path imports this module yet: it is tested on its own (gloo, 2 ranks, against the unsharded
reference) and waits for the tensor-parallel LM head of the scale-out work (docs/architecture.md, `distributed/`).
"""

from __future__ import annotations

from types import ModuleType

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from .linear_logprob import LinearLogprobOutput

_NO_IGNORE = -1  # the stand-in targets are >= 0, so nothing is ignored inside the backend


def shard_range(vocab: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, stop) of rank's rows when V is split into world_size nearly equal contiguous shards."""
    base, extra = divmod(vocab, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def _all_reduce(t: torch.Tensor, op, group) -> torch.Tensor:
    dist.all_reduce(t, op=op, group=group)
    return t


def _merge_lse(lse_local: torch.Tensor, group) -> torch.Tensor:
    top = _all_reduce(lse_local.clone(), dist.ReduceOp.MAX, group)
    total = _all_reduce(torch.exp(lse_local - top), dist.ReduceOp.SUM, group)
    return top + torch.log(total)


def _target_logit(hidden: torch.Tensor, weight: torch.Tensor, local_y: torch.Tensor, owned: torch.Tensor,
                  temperature: float, group) -> torch.Tensor:
    rows = torch.where(owned, local_y, 0)
    z = (hidden.float() * weight[rows].float()).sum(-1) / temperature
    return _all_reduce(torch.where(owned, z, 0.0), dist.ReduceOp.SUM, group)


class _VocabParallelLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, teacher_hidden, vocab_start, group, backend, temperature,
                with_entropy, ignore_index):
        valid = targets != ignore_index
        local_y = targets - vocab_start
        owned = valid & (local_y >= 0) & (local_y < weight.shape[0])
        stand_in = torch.zeros_like(targets)
        # The stand-in targets (all 0) are in range by construction: no range check, no host sync for it.
        _, ent_r, tlp_r, lse_r = backend.forward(hidden, weight, stand_in, teacher_hidden, temperature,
                                                 with_entropy, _NO_IGNORE, check_targets=False)
        lse = _merge_lse(lse_r, group)
        logprob = torch.where(valid, _target_logit(hidden, weight, local_y, owned, temperature, group) - lse, 0.0)

        entropy = None
        if with_entropy:
            log_w = lse_r - lse
            entropy = _all_reduce(torch.exp(log_w) * (ent_r - log_w), dist.ReduceOp.SUM, group)
        teacher_logprob = None
        if teacher_hidden is not None:
            # The backend gave ℓ_r of the stand-in column 0: its local lse is z_0 - ℓ_r.
            z0 = (teacher_hidden.float() @ weight[0].float()) / temperature
            teacher_lse = _merge_lse(z0 - tlp_r, group)
            zy = _target_logit(teacher_hidden, weight, local_y, owned, temperature, group)
            teacher_logprob = torch.where(valid, zy - teacher_lse, 0.0)

        ctx.save_for_backward(hidden, weight, local_y, owned, valid, lse, entropy)
        ctx.setup = (group, backend, temperature)
        ctx.mark_non_differentiable(*([teacher_logprob] if teacher_logprob is not None else []))
        return logprob, torch.where(valid, entropy, 0.0) if entropy is not None else None, teacher_logprob

    @staticmethod
    def backward(ctx, grad_logprob, grad_entropy, _grad_teacher):
        hidden, weight, local_y, owned, valid, lse, entropy = ctx.saved_tensors
        group, backend, temperature = ctx.setup
        zeros = torch.zeros_like(lse)
        a = torch.where(valid, grad_logprob.float(), 0.0) if grad_logprob is not None else zeros
        b = None
        if entropy is not None and grad_entropy is not None:
            b = torch.where(valid, grad_entropy.float(), 0.0)
        grad_h, grad_w = backend.backward(hidden, weight, torch.zeros_like(local_y), lse,
                                          entropy if b is not None else None, a, b, temperature, _NO_IGNORE)

        # Replace the stand-in onehot (column 0 for every row) by the true one (owned rows only).
        h32, w32 = hidden.float(), weight.float()
        a_t = a / temperature
        own_rows = torch.where(owned, local_y, 0)
        grad_h = grad_h.float() + a_t[:, None] * (torch.where(owned, 1.0, 0.0)[:, None] * w32[own_rows] - w32[0])
        # Row 0 of dW: recomputed whole in fp32 (the stand-in term there can dwarf the true value).
        log_p0 = h32 @ w32[0] / temperature - lse
        p0 = torch.exp(log_p0)
        g0 = a * (torch.where(owned & (local_y == 0), 1.0, 0.0) - p0)
        if b is not None:
            g0 = g0 - b * p0 * (log_p0 + entropy)
        grad_w[0] = ((g0 / temperature) @ h32).to(grad_w.dtype)
        # Other owned targets: add a·h/T to their rows, in fp32 before one rounding.
        hit = owned & (local_y != 0)
        if bool(hit.any()):
            rows, slot = torch.unique(local_y[hit], return_inverse=True)
            acc = grad_w[rows].float().index_add_(0, slot, a_t[hit, None] * h32[hit])
            grad_w[rows] = acc.to(grad_w.dtype)
        grad_h = _all_reduce(grad_h, dist.ReduceOp.SUM, group).to(hidden.dtype)
        return grad_h, grad_w, *(None,) * 8


def vocab_parallel_logprob(hidden: torch.Tensor, weight_shard: torch.Tensor, targets: torch.Tensor,
                           vocab_start: int, *, group=None, teacher_hidden: torch.Tensor | None = None,
                           temperature: float = 1.0, with_entropy: bool = False, ignore_index: int = -100,
                           backend: str | ModuleType = "auto") -> LinearLogprobOutput:
    """linear_logprob over the full vocabulary when this rank holds rows [vocab_start, vocab_start + V_local)
    of W. hidden, targets (global ids) and teacher_hidden are the same on every rank of `group`.
    Gradients: hidden gets the full (all-reduced) gradient, weight_shard its local rows."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("vocab_parallel_logprob needs an initialized torch.distributed process group")
    if type(weight_shard).__name__ == "DTensor":
        raise TypeError("weight_shard is a DTensor; pass its local shard (.to_local())")
    if hidden.dim() != 2 or weight_shard.dim() != 2 or hidden.shape[1] != weight_shard.shape[1]:
        raise ValueError(f"hidden {tuple(hidden.shape)} and weight_shard {tuple(weight_shard.shape)} must be "
                         "[N, d] and [V_local, d]")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets must be [N={hidden.shape[0]}], got {tuple(targets.shape)}")
    if weight_shard.shape[0] == 0:
        raise ValueError("weight_shard has no rows: give every rank at least one vocabulary row")
    if isinstance(backend, str):
        from .dispatch import get_backend

        backend = get_backend(backend, hidden.device)
    logprob, entropy, teacher_logprob = _VocabParallelLogprob.apply(
        hidden, weight_shard, targets, teacher_hidden, int(vocab_start), group, backend, float(temperature),
        bool(with_entropy), int(ignore_index))
    return LinearLogprobOutput(logprob, entropy, teacher_logprob)


class _VocabParallelDivergence(torch.autograd.Function):
    """Σ_t c_t·D_t over the whole vocabulary when this rank holds a shard of W (ops/divergence.py): each rank's
    backend gives its shard's log-normalizers of both contexts, merged over the group; with the global ones each
    rank's partial sums add up to D and its center (all-reduce of [N] scalars), and each rank's backward gives its
    slice of the student's logits gradient: dW stays local, dH is all-reduced."""

    @staticmethod
    def forward(ctx, hidden, weight, teacher_hidden, coef, group, backend, kind, beta, temperature, extra_out):
        setup = {"kind": kind, "beta": beta, "temperature": temperature}
        active = coef != 0
        _, _, lse_r, teacher_lse_r = backend.divergence_forward(hidden, teacher_hidden, weight, active, **setup)
        lse, teacher_lse = _merge_lse(lse_r, group), _merge_lse(teacher_lse_r, group)
        value, center = backend.divergence_partial(hidden, teacher_hidden, weight, active, lse, teacher_lse, **setup)
        value = _all_reduce(value, dist.ReduceOp.SUM, group)
        center = _all_reduce(center, dist.ReduceOp.SUM, group)
        grad_h, grad_w = backend.divergence_backward(hidden, teacher_hidden, weight, lse, teacher_lse, center, coef,
                                                     **setup, need_hidden_grad=ctx.needs_input_grad[0],
                                                     need_weight_grad=ctx.needs_input_grad[1])
        if grad_h is not None:
            grad_h = _all_reduce(grad_h.float(), dist.ReduceOp.SUM, group).to(hidden.dtype)
        ctx.grads = (grad_h, grad_w)
        extra_out["value"] = torch.where(active, value, 0.0)
        return (coef * extra_out["value"]).sum()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss):
        # The gradients are computed in forward and released here: keeping them for a second call would hold a dW of
        # this shard's size as long as the graph lives, so a second call is an error (as fused_divergence's).
        if ctx.grads is None:
            raise RuntimeError("vocab_parallel_divergence: backward ran twice; its gradients are computed in forward "
                               "and handed out once (do not use retain_graph=True through vocab_parallel_divergence)")
        grad_h, grad_w = ctx.grads
        ctx.grads = None
        return (None if grad_h is None else grad_h * grad_loss, None if grad_w is None else grad_w * grad_loss,
                *(None,) * 8)


def vocab_parallel_divergence(hidden: torch.Tensor, weight_shard: torch.Tensor, teacher_hidden: torch.Tensor, *,
                              token_weights: torch.Tensor, kind: str = "reverse_kl", beta: float = 0.5,
                              temperature: float = 1.0, group=None,
                              backend: str | ModuleType = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """fused_divergence (ops/divergence.py; same results) when this rank holds a shard of W's rows; hidden,
    teacher_hidden and token_weights are the same on every rank of `group`. Differentiable once (no retain_graph)."""
    from .divergence import check_divergence_inputs

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("vocab_parallel_divergence needs an initialized torch.distributed process group")
    if type(weight_shard).__name__ == "DTensor":
        raise TypeError("weight_shard is a DTensor; pass its local shard (.to_local())")
    coef = check_divergence_inputs("vocab_parallel_divergence", hidden, teacher_hidden, weight_shard, token_weights,
                                   kind, beta, temperature)
    if isinstance(backend, str):
        from .dispatch import get_divergence_backend

        backend = get_divergence_backend(backend, hidden.device)
    extra: dict = {}
    loss = _VocabParallelDivergence.apply(hidden, weight_shard, teacher_hidden.detach(), coef, group, backend, kind,
                                          float(beta), float(temperature), extra)
    return loss, extra["value"].detach()
