"""Independent references for the kernel tests: fp64, materialized logits (fine at test sizes)."""

from __future__ import annotations

import pytest
import torch

INTERPRETER = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter tests run on CPU-only machines; "
                                 "the gpu tests cover the compiled kernels here")
GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def reference_logprob(hidden, weight, targets, teacher_hidden=None, temperature=1.0, ignore_index=-100):
    """fp64 (logprob, entropy, teacher_logprob | None, lse); ignored rows get logprob = entropy = 0."""
    keep = targets != ignore_index
    safe = torch.where(keep, targets, 0).unsqueeze(1)

    def stats(h):
        z = h.double() @ weight.double().T / temperature
        logp = torch.log_softmax(z, dim=-1)
        lp = torch.where(keep, logp.gather(1, safe).squeeze(1), 0.0)
        ent = torch.where(keep, -(logp.exp() * logp).sum(-1), 0.0)
        return lp, ent, torch.logsumexp(z, dim=-1)

    lp, ent, lse = stats(hidden)
    teacher = None if teacher_hidden is None else stats(teacher_hidden)[0]
    return lp, ent, teacher, lse


def reference_grads(hidden, weight, targets, grad_logprob, grad_entropy=None, temperature=1.0, ignore_index=-100):
    """fp64 gradients of Σ grad_logprob·ℓ + Σ grad_entropy·H w.r.t. hidden and weight (autograd)."""
    h = hidden.detach().double().requires_grad_()
    w = weight.detach().double().requires_grad_()
    lp, ent, _, _ = reference_logprob(h, w, targets, None, temperature, ignore_index)
    total = (lp * grad_logprob.double()).sum()
    if grad_entropy is not None:
        total = total + (ent * grad_entropy.double()).sum()
    total.backward()
    return h.grad, w.grad


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rel: float, what: str = "") -> None:
    """Every element within rel·max(1, max|expected|): relative to the tensor's scale, since sums of
    terms of both signs (gradients, log-probs near 0) have no meaningful per-element relative error."""
    actual = actual.double()
    scale = max(1.0, float(expected.abs().max())) if expected.numel() else 1.0
    err = (actual - expected).abs()
    if not bool((err <= rel * scale).all()):
        worst = int(err.argmax())
        raise AssertionError(f"{what}: error {float(err.max()):.3e} > {rel * scale:.3e} at element {worst} "
                             f"({float(actual.flatten()[worst]):.8g} vs {float(expected.flatten()[worst]):.8g})")
