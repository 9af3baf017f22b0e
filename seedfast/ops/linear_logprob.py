"""linear_logprob: log πθ(y_t), and optionally the entropy H_t and a second (teacher) context's
log-prob, from final hidden states and the LM-head weight without materializing [N, V] logits."""

from __future__ import annotations

from types import ModuleType
from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

from .dispatch import get_backend
from .validate import check_linear_inputs


class LinearLogprobOutput(NamedTuple):
    logprob: torch.Tensor                  # [N] fp32, differentiable w.r.t. hidden and weight
    entropy: torch.Tensor | None           # [N] fp32, differentiable, or None
    teacher_logprob: torch.Tensor | None   # [N] fp32, detached, or None


class _LinearLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                teacher_hidden: torch.Tensor | None, temperature: float, with_entropy: bool, ignore_index: int,
                backend: ModuleType):
        ctx.set_materialize_grads(False)
        logprob, entropy, teacher_logprob, lse = backend.forward(
            hidden, weight, targets, teacher_hidden, temperature, with_entropy, ignore_index, check_targets=False)
        ctx.save_for_backward(hidden, weight, targets, lse, entropy)
        ctx.backend, ctx.temperature, ctx.ignore_index = backend, temperature, ignore_index
        if teacher_logprob is not None:
            ctx.mark_non_differentiable(teacher_logprob)
        return logprob, entropy, teacher_logprob

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logprob: torch.Tensor | None, grad_entropy: torch.Tensor | None, _grad_teacher):
        none = (None,) * 6
        if grad_logprob is None and grad_entropy is None:
            return None, None, *none
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        if grad_logprob is None:
            grad_logprob = torch.zeros_like(lse)
        # A frozen LM head (or hidden states without grad): the backend skips that gradient's GEMM.
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden, grad_weight = ctx.backend.backward(
            hidden, weight, targets, lse, entropy, grad_logprob.float(),
            None if grad_entropy is None else grad_entropy.float(), ctx.temperature, ctx.ignore_index,
            need_hidden_grad=need_hidden, need_weight_grad=need_weight)
        return (grad_hidden if need_hidden else None, grad_weight if need_weight else None, *none)


def linear_logprob(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                   teacher_hidden: torch.Tensor | None = None, temperature: float = 1.0,
                   with_entropy: bool = False, ignore_index: int = -100, backend: str = "auto"
                   ) -> LinearLogprobOutput:
    """Per-token log πθ(y_t) for logits z = hidden·weightᵀ / temperature, streamed over the vocabulary.

    hidden [N, d] and weight [V, d] (bf16/fp16/fp32; weight may be tied to the embeddings) receive
    gradients from logprob and entropy; targets [N] int64, where ignore_index gives logprob 0,
    entropy 0 and no gradient. teacher_hidden [N, d] scores the same targets in a second context
    (sharing each weight tile), returned detached. Entropy is computed only when with_entropy.
    Accumulation is fp32; extra memory is O(N + tile), never O(N·V). backend: "auto", "torch", "triton".
    """
    func = "linear_logprob"
    # Validates the targets' range (the one host sync for it): the backends are called with check_targets=False.
    targets = check_linear_inputs(func, hidden, weight, targets, teacher_hidden, temperature, ignore_index)
    impl = get_backend(backend, hidden.device)
    temperature, with_entropy = float(temperature), bool(with_entropy)
    if teacher_hidden is not None:
        teacher_hidden = teacher_hidden.detach()
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return LinearLogprobOutput(*_LinearLogprob.apply(hidden, weight, targets, teacher_hidden, temperature,
                                                         with_entropy, ignore_index, impl))
    logprob, entropy, teacher_logprob, _ = impl.forward(hidden, weight, targets, teacher_hidden, temperature,
                                                        with_entropy, ignore_index, check_targets=False)
    return LinearLogprobOutput(logprob, entropy, teacher_logprob)
