"""fp64 reference of the divergences (docs/kernels.md, "Divergence kernels"), from materialized logits with
torch.log_softmax and autograd: the value, the center the backward needs, both lse, and the gradients of
Σ_t coef_t·D_t with respect to the student's hidden rows and W (the teacher side detached)."""

from __future__ import annotations

import math

import torch

KINDS = ("reverse_kl", "forward_kl", "jsd")


def reference_divergence(hidden, teacher_hidden, weight, coef, kind, beta=0.5, temperature=1.0):
    """-> dict of value, center, lse, teacher_lse [N] and grad_hidden [N, d], grad_weight [V, d], all fp64; rows with
    coef == 0 are computed from zeroed hidden rows and weigh 0 (their value is not meaningful)."""
    off = coef == 0
    h = hidden.detach().double().masked_fill(off[:, None], 0.0).requires_grad_()
    ht = teacher_hidden.detach().double().masked_fill(off[:, None], 0.0)
    w = weight.detach().double().requires_grad_()
    zs = h @ w.T / temperature
    zt = ht @ w.detach().T / temperature
    ls, lt = torch.log_softmax(zs, -1), torch.log_softmax(zt, -1)
    if kind == "reverse_kl":
        value = (ls.exp() * (ls - lt)).sum(-1)
        center = value
    elif kind == "forward_kl":
        value = (lt.exp() * (lt - ls)).sum(-1)
        center = torch.zeros_like(value)
    else:
        lm = torch.logaddexp(ls + math.log(1 - beta), lt + math.log(beta))
        center = (ls.exp() * (ls - lm)).sum(-1)
        value = beta * (lt.exp() * (lt - lm)).sum(-1) + (1 - beta) * center
    (coef.double().masked_fill(off, 0.0) * value).sum().backward()
    return {"value": value.detach(), "center": center.detach(), "lse": torch.logsumexp(zs, -1).detach(),
            "teacher_lse": torch.logsumexp(zt, -1), "grad_hidden": h.grad, "grad_weight": w.grad}
