"""fused_divergence: a full-vocabulary divergence between the student's and the teacher's next-token distributions,
from their hidden states and the LM head, with no [N, V] logits (docs/algorithms.md, 'Forms of the teacher term').

    loss = Σ_t c_t·D_t(π_θ(·|student context) ‖ sg π(·|teacher context))

D is the reverse KL, the forward KL or the generalized JSD_β (TRL's GKD convention). The teacher side is stop-gradient
(its hidden rows and its use of W): the gradient reaches the student's hidden rows and W through the student's logits
only. Backend protocol (seedfast/ops/dispatch.py get_divergence_backend; torch: chunked_divergence.py, Triton:
triton_divergence.py):

    divergence_forward(hidden, teacher_hidden, weight, active, *, kind, beta, temperature)
        -> (value, center, lse, teacher_lse) [N] fp32, 0 on inactive rows
    divergence_partial(hidden, teacher_hidden, weight, active, lse, teacher_lse, *, kind, beta, temperature)
        -> (value, center) over this weight's vocabulary rows, under the given normalizers (vocabulary-parallel heads)
    divergence_backward(hidden, teacher_hidden, weight, lse, teacher_lse, center, coef, *, kind, beta, temperature,
                        need_hidden_grad, need_weight_grad) -> (grad_hidden, grad_weight)
    divergence_forward_backward(hidden, teacher_hidden, weight, coef, *, kind, beta, temperature, need_hidden_grad,
                                need_weight_grad) -> (value, grad_hidden, grad_weight)        (optional)

`center` is what the student's logits gradient subtracts: D for the reverse KL, K = Σ p_s·log(p_s/M) for the JSD.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch.autograd.function import once_differentiable

from seedfast.sampling_params import check_scoring_temperature

from .dispatch import get_divergence_backend
from .validate import check_finite, check_per_token

KINDS = ("reverse_kl", "forward_kl", "jsd")


def divergence_kind(opd_mode: str, jsd_beta: float) -> tuple[str, float]:
    """(kind, β) of a teacher-term form: `jsd` at β = 0 and β = 1 is TRL's forward and reverse KL (its GKD loss
    special-cases both ends, where the mixture formula would be 0)."""
    if opd_mode == "reverse_kl":
        return "reverse_kl", 1.0
    if opd_mode != "jsd":
        raise ValueError(f"divergence_kind: opd_mode={opd_mode!r} is not a divergence form ('reverse_kl', 'jsd')")
    if jsd_beta == 0.0:
        return "forward_kl", 0.0
    if jsd_beta == 1.0:
        return "reverse_kl", 1.0
    return "jsd", float(jsd_beta)


class _FusedDivergence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, teacher_hidden: torch.Tensor, coef: torch.Tensor,
                backend: ModuleType, kind: str, beta: float, temperature: float, extra_out: dict):
        need = {"need_hidden_grad": ctx.needs_input_grad[0], "need_weight_grad": ctx.needs_input_grad[1]}
        setup = {"kind": kind, "beta": beta, "temperature": temperature}
        if hasattr(backend, "divergence_forward_backward"):
            value, grad_hidden, grad_weight = backend.divergence_forward_backward(hidden, teacher_hidden, weight, coef,
                                                                                  **setup, **need)
        else:
            value, center, lse, teacher_lse = backend.divergence_forward(hidden, teacher_hidden, weight, coef != 0,
                                                                         **setup)
            grad_hidden, grad_weight = backend.divergence_backward(hidden, teacher_hidden, weight, lse, teacher_lse,
                                                                   center, coef, **setup, **need)
        extra_out["value"] = value
        ctx.grads = (grad_hidden, grad_weight)
        return (coef * value).sum()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss: torch.Tensor):
        if ctx.grads is None:
            raise RuntimeError("fused_divergence: backward ran twice; its gradients are computed in forward and "
                               "handed out once (do not use retain_graph=True through fused_divergence)")
        grad_hidden, grad_weight = ctx.grads
        ctx.grads = None
        for grad in (grad_hidden, grad_weight):
            if grad is not None:
                grad.mul_(grad_loss)
        return (grad_hidden if ctx.needs_input_grad[0] else None,
                grad_weight if ctx.needs_input_grad[1] else None, *(None,) * 7)


def check_divergence_inputs(func: str, hidden: object, teacher_hidden: object, weight: object, token_weights: object,
                            kind: str, beta: float, temperature: float) -> torch.Tensor:
    """One clear error naming the offending tensor or option; returns the token weights as fp32."""
    for name, x in (("hidden", hidden), ("teacher_hidden", teacher_hidden), ("weight", weight)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{func}: {name} must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise ValueError(f"{func}: {name} must be floating point, got {x.dtype}")
        if x.dim() != 2:
            raise ValueError(f"{func}: {name} must be 2-D, got shape {tuple(x.shape)}")
        if x.device != hidden.device:
            raise ValueError(f"{func}: {name} is on {x.device}, hidden on {hidden.device}")
    if teacher_hidden.shape != hidden.shape:
        raise ValueError(f"{func}: teacher_hidden has shape {tuple(teacher_hidden.shape)}; it must match hidden's "
                         f"{tuple(hidden.shape)} (one teacher row per student row)")
    if weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"{func}: weight [V, d] has d = {weight.shape[1]}, hidden has d = {hidden.shape[1]}")
    if kind not in KINDS:
        raise ValueError(f"{func}: unknown kind={kind!r}; allowed values: {', '.join(map(repr, KINDS))}")
    if kind == "jsd" and not 0.0 < beta < 1.0:
        raise ValueError(f"{func}: kind='jsd' needs 0 < beta < 1 (its ends are 'forward_kl' and 'reverse_kl'), "
                         f"got {beta}")
    check_scoring_temperature(temperature, func)
    weights = check_per_token(func, "token_weights", token_weights, hidden.shape[0], hidden.device).detach().float()
    # A NaN weight is != 0, so its row would count, and NaN·D makes the loss and every gradient NaN.
    check_finite(func, "token_weights", weights)
    return weights


def fused_divergence(hidden: torch.Tensor, teacher_hidden: torch.Tensor, weight: torch.Tensor, *,
                     token_weights: torch.Tensor, kind: str = "reverse_kl", beta: float = 0.5,
                     temperature: float = 1.0, backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """(loss 0-dim fp32 = Σ_t w_t·D_t, D [N] fp32 detached) for logits hidden·Wᵀ/T (student) and teacher_hidden·Wᵀ/T
    (teacher, stop-gradient). Rows with w_t = 0 are not computed (D = 0 there) and may hold anything. Differentiable
    w.r.t. hidden and weight, once (no retain_graph)."""
    func = "fused_divergence"
    coef = check_divergence_inputs(func, hidden, teacher_hidden, weight, token_weights, kind, beta, temperature)
    impl = get_divergence_backend(backend, hidden.device)
    teacher_hidden = teacher_hidden.detach()
    temperature, beta = float(temperature), float(beta)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        extra: dict = {}
        loss = _FusedDivergence.apply(hidden, weight, teacher_hidden, coef, impl, kind, beta, temperature, extra)
        return loss, extra["value"].detach()
    value, _, _, _ = impl.divergence_forward(hidden, teacher_hidden, weight, coef != 0, kind=kind, beta=beta,
                                             temperature=temperature)
    return (coef * value).sum(), value
