"""Independent references for the kernel tests: fp64, materialized logits (fine at test sizes)."""

from __future__ import annotations

import math

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


def reference_token_loss(logprob, entropy, old_logprob, ref_logprob, teacher_logprob, teacher_mask, advantages,
                         token_weights, *, clip_low, clip_high, dual_clip, kl_coef, kl_kind, entropy_coef, opd_coef,
                         opd_beta, gate):
    """The loss of docs/algorithms.md per token in fp64, written out; a and b by autograd."""
    w = token_weights.double()
    on = w != 0
    clean = lambda x: None if x is None else torch.where(on, x.double(), 0.0)  # noqa: E731
    lp = clean(logprob).requires_grad_()
    ent = None if entropy is None else clean(entropy).requires_grad_()
    old, ref, teacher, adv = clean(old_logprob), clean(ref_logprob), clean(teacher_logprob), clean(advantages)
    ratio = torch.exp((lp - old).clamp(-20, 20))
    pg1, pg2 = -adv * ratio, -adv * ratio.clamp(1 - clip_low, 1 + clip_high)
    pg = torch.maximum(pg1, pg2)
    if dual_clip is not None:
        pg = torch.where((adv < 0) & (pg > -adv * dual_clip), -adv * dual_clip, pg)
    per = pg
    sums = {"weight": w.sum(), "clip_frac": (w * (pg2 > pg1)).sum(),
            "ratio_min": torch.where(on, ratio, math.inf).min(), "ratio_max": torch.where(on, ratio, -math.inf).max()}
    if ref is not None:
        diff = lp - ref
        if kl_kind == "k1":
            kl = diff
        elif kl_kind == "k2":
            kl = 0.5 * diff**2
        else:
            r = (-diff).clamp(-20, 20)
            kl = (torch.exp(r) - r - 1).clamp(-10, 10)
        per = per + kl_coef * kl
        sums["kl"] = (w * kl).sum()
    if ent is not None:
        per = per - entropy_coef * ent
        sums["entropy"] = (w * ent).sum()
    loss = (w * per).sum()
    if teacher is not None and (gate == "gap" or ent is not None):
        m = on if teacher_mask is None else on & teacher_mask.bool()
        delta = (teacher - lp).detach()
        x = {"gap": lambda: delta, "entropy": lambda: ent.detach(),
             "soft_or": lambda: 1 - (1 - (1 - torch.exp(-ent.detach().clamp_min(0))))
                                    * (1 - (1 - torch.exp(-delta.clamp_min(0))))}[gate]()
        g = torch.sigmoid(opd_beta * x)
        opd = torch.where(m, g * (teacher - lp), 0.0)
        loss = loss + opd_coef * (w * opd).sum()
        sums.update(teacher_weight=(w * m).sum(), gate=(w * torch.where(m, g, 0.0)).sum(), opd_term=(w * opd).sum())
    leaves = [lp] if ent is None else [lp, ent]
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    a = grads[0]
    b = grads[1] if ent is not None and entropy_coef != 0 else None
    return loss.detach(), a, b, {k: v.detach() for k, v in sums.items()}
