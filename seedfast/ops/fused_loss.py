"""fused_loss: the whole loss of docs/algorithms.md ('Total loss and aggregation') from hidden states and the LM
head, with its gradient computed in
the same streamed pass as the log-probs (no [N, V] logits, no second autograd graph).

    L = Σ_t w_t·(pg_t + kl_coef·kl_t − entropy_coef·H_t) + opd_coef·Σ_t w_t·m_t·g_t·(sg[ℓskill_t] − ℓθ_t)

token_weights w carry the aggregation: seedfast.algo.losses.aggregation_weights(mask, mode) flattened.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch.autograd.function import once_differentiable

from seedfast.algo.losses import PLAIN_PPO, LossOptions

from .dispatch import get_backend
from .token_loss import metric_means, needs_entropy
from .validate import check_linear_inputs, check_loss_options, check_per_token

Metrics = dict[str, torch.Tensor]


class _FusedLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, backend: ModuleType,
                temperature: float, ignore_index: int, per_token: dict, options: LossOptions, extra_out: dict):
        with_entropy = needs_entropy(options)
        # Only the gradients autograd will ask for are computed: a frozen LM head costs no dW GEMM.
        need = {"need_hidden_grad": ctx.needs_input_grad[0], "need_weight_grad": ctx.needs_input_grad[1]}
        if hasattr(backend, "fused_forward_backward"):
            loss, sums, grad_hidden, grad_weight, logprob = backend.fused_forward_backward(
                hidden, weight, targets, temperature=temperature, ignore_index=ignore_index,
                with_entropy=with_entropy, per_token=per_token, options=options, **need)
        else:
            logprob, entropy, _, lse = backend.forward(hidden, weight, targets, None, temperature, with_entropy,
                                                       ignore_index, check_targets=False)
            loss, a, b, sums = backend.token_loss(logprob, entropy, **per_token, options=options)
            grad_hidden, grad_weight = backend.backward(hidden, weight, targets, lse, entropy, a, b, temperature,
                                                        ignore_index, **need)
        extra_out.update(sums=sums, logprob=logprob)
        ctx.grads = (grad_hidden, grad_weight)
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss: torch.Tensor):
        if ctx.grads is None:
            raise RuntimeError("fused_loss: backward ran twice; its gradients are computed in forward and "
                               "handed out once (do not use retain_graph=True through fused_loss)")
        grad_hidden, grad_weight = ctx.grads
        ctx.grads = None
        # In place: the gradients are ours, and a copy of [V, d] would be pure waste. A gradient not
        # needed was not computed (None).
        for grad in (grad_hidden, grad_weight):
            if grad is not None:
                grad.mul_(grad_loss)
        return (grad_hidden if ctx.needs_input_grad[0] else None,
                grad_weight if ctx.needs_input_grad[1] else None, *(None,) * 7)


def loss_inputs(func: str, targets: torch.Tensor, ignore_index: int, n: int, device: torch.device, *,
                token_weights: torch.Tensor, advantages: torch.Tensor, old_logprob: torch.Tensor | None,
                ref_logprob: torch.Tensor | None, teacher_logprob: torch.Tensor | None,
                teacher_mask: torch.Tensor | None, options: LossOptions) -> tuple[dict, LossOptions]:
    """(per-token inputs, loss options) of fused_loss and its tensor-parallel twin (distributed/vocab_head.py), checked
    with errors naming `func` and the tensor; token weights are 0 where the target is ignore_index."""
    per_token = {
        "old_logprob": check_per_token(func, "old_logprob", old_logprob, n, device, required=False),
        "ref_logprob": check_per_token(func, "ref_logprob", ref_logprob, n, device, required=False),
        "teacher_logprob": check_per_token(func, "teacher_logprob", teacher_logprob, n, device, required=False),
        "teacher_mask": check_per_token(func, "teacher_mask", teacher_mask, n, device, floating=False,
                                        required=False),
        "advantages": check_per_token(func, "advantages", advantages, n, device),
        "token_weights": check_per_token(func, "token_weights", token_weights, n, device),
    }
    options = check_loss_options(func, options, has_ref=ref_logprob is not None,
                                 has_teacher=teacher_logprob is not None)
    per_token["token_weights"] = torch.where(targets == ignore_index, 0.0, token_weights.detach().float())
    return per_token, options


def fused_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
               token_weights: torch.Tensor, advantages: torch.Tensor, old_logprob: torch.Tensor | None,
               ref_logprob: torch.Tensor | None = None, teacher_logprob: torch.Tensor | None = None,
               teacher_mask: torch.Tensor | None = None, options: LossOptions = PLAIN_PPO,
               temperature: float = 1.0, ignore_index: int = -100, backend: str = "auto",
               return_logprob: bool = False
               ) -> tuple[torch.Tensor, Metrics] | tuple[torch.Tensor, Metrics, torch.Tensor]:
    """(loss 0-dim fp32, metrics) of the total loss (docs/algorithms.md) for tokens t with logits hidden·weightᵀ /
    temperature, and
    with return_logprob=True also the detached per-token ℓθ [N] fp32 (0 on ignored tokens).

    Per-token [N] inputs: token_weights (aggregation weights, 0 on non-response tokens), advantages,
    old_logprob (None = on-policy: ℓold = sg(ℓθ) of this very call, so every ratio is 1 and no separate
    ℓold pass is needed), and optionally ref_logprob, teacher_logprob (ℓskill) and teacher_mask (bool or 0/1).
    `options` holds the loss's knobs (seedfast.algo.losses.LossOptions; default: plain PPO, every coefficient 0).
    A nonzero kl_coef / opd_coef needs ref_logprob / teacher_logprob. The entropy is computed only
    when a term uses it (entropy_coef ≠ 0, or opd_coef ≠ 0 with gate "entropy" or "soft_or").
    Tokens whose target is ignore_index get weight 0. The loss is differentiable w.r.t. hidden and
    weight (once: no retain_graph). Metrics (detached 0-dim): clip_frac, ratio_min, ratio_max, and kl,
    entropy, gate_mean, opd_term when computed; means weighted by token_weights (gate_mean and
    opd_term over teacher-valid tokens), so for token-mean weights they are plain token means.
    """
    func = "fused_loss"
    targets = check_linear_inputs(func, hidden, weight, targets, None, temperature, ignore_index)
    n, device = hidden.shape[0], hidden.device
    per_token, options = loss_inputs(
        func, targets, ignore_index, n, device, token_weights=token_weights, advantages=advantages,
        old_logprob=old_logprob, ref_logprob=ref_logprob, teacher_logprob=teacher_logprob, teacher_mask=teacher_mask,
        options=options)
    impl = get_backend(backend, device)
    temperature = float(temperature)

    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        extra: dict = {}
        loss = _FusedLoss.apply(hidden, weight, targets, impl, temperature, ignore_index, per_token, options, extra)
        sums, logprob = extra["sums"], extra["logprob"]
    else:
        logprob, entropy, _, _ = impl.forward(hidden, weight, targets, None, temperature, needs_entropy(options),
                                              ignore_index, check_targets=False)
        loss, _, _, sums = impl.token_loss(logprob, entropy, **per_token, options=options)
    metrics = metric_means(sums)
    metrics["loss"] = loss.detach()
    if return_logprob:
        return loss, metrics, logprob.detach()
    return loss, metrics
