"""The per-token loss (docs/algorithms.md, 'Total loss and aggregation') on [N] tensors and its derivatives
a = ∂L/∂ℓθ, b = ∂L/∂H.

    L = Σ_t w_t·(pg_t + kl_coef·kl_t − entropy_coef·H_t) + opd_coef·Σ_t w_t·m_t·g_t·(sg[ℓskill_t] − ℓθ_t)

with opd_mode "gate"; with "advantage" the opd term is gone and pg_t sees A_t + opd_coef·m_t·clip(sg[ℓskill_t] − ℓold_t)
(opd_term: the mean of that shift over teacher-valid tokens); the divergence forms add nothing here (their term is
seedfast.ops.fused_divergence's). The terms come from seedfast.algo.losses (the reference math, written once); this
module only weights them by the aggregation weights w and differentiates the O(N) result with autograd, which
is all the streamed logits gradient needs. Tokens with w = 0 are zeroed before any arithmetic, so
padding may hold anything (NaN, −inf) without leaking into the loss or its gradient.
"""

from __future__ import annotations

import torch

from seedfast.algo import losses
from seedfast.algo.losses import LossOptions

MetricSums = dict[str, torch.Tensor]

# Sums that merge by min/max rather than by addition.
_MIN_KEYS = ("ratio_min",)
_MAX_KEYS = ("ratio_max",)


def needs_entropy(options: LossOptions) -> bool:
    """Whether the loss uses the student entropy (it costs a pass over the vocabulary)."""
    return options.entropy_coef != 0 or (options.opd_coef != 0 and options.opd_mode == "gate"
                                         and options.gate != "gap")


def token_loss(logprob: torch.Tensor, entropy: torch.Tensor | None, old_logprob: torch.Tensor | None,
               ref_logprob: torch.Tensor | None, teacher_logprob: torch.Tensor | None,
               teacher_mask: torch.Tensor | None, advantages: torch.Tensor, token_weights: torch.Tensor, *,
               options: LossOptions) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, MetricSums]:
    """(loss 0-dim fp32, a [N] fp32, b [N] fp32 | None, metric sums).

    Metric sums are weighted by token_weights (divide by sums["weight"] for means): clip_frac, kl (with
    ref_logprob), entropy (with entropy), gate and opd_term (with teacher_logprob; divide those by
    sums["teacher_weight"] = Σ w·m); ratio_min/ratio_max are unweighted over tokens with w ≠ 0
    (+inf/−inf when there is none). b is None when the loss does not depend on the entropy.
    old_logprob None means on-policy: ℓold = sg(ℓθ), every ratio is 1.
    """
    w = token_weights.detach().float()
    active = w != 0

    def clean(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else torch.where(active, x.detach().float(), 0.0)

    lp = clean(logprob).requires_grad_()
    h = clean(entropy)
    if h is not None:
        h.requires_grad_()
    old = clean(logprob if old_logprob is None else old_logprob)
    ref, teacher, adv = clean(ref_logprob), clean(teacher_logprob), clean(advantages)
    sums: MetricSums = {"weight": w.sum()}

    shift = None
    if teacher is not None and options.opd_mode == "advantage":
        m = active if teacher_mask is None else active & (teacher_mask != 0)
        shift = losses.opd_advantage_shift(teacher, old, m, options.opd_coef, options.opd_adv_clip)
        adv = adv + shift
        sums["teacher_weight"] = (w * m).sum()
        sums["opd_term"] = (w * shift).sum()

    with torch.enable_grad():
        terms = losses.policy_terms(lp, old, adv, options.clip_low, options.clip_high, options.dual_clip)
        per_token = terms.pg
        if ref is not None:
            kl = losses.kl_penalty(lp, ref, options.kl_kind)
            sums["kl"] = (w * kl).sum()
            if options.kl_coef != 0:
                per_token = per_token + options.kl_coef * kl
        if h is not None:
            sums["entropy"] = (w * h).sum()
            if options.entropy_coef != 0:
                per_token = per_token - options.entropy_coef * h
        loss = (w * per_token).sum()

        if teacher is not None and options.opd_mode == "gate" and (options.gate == "gap" or h is not None):
            m = active if teacher_mask is None else active & (teacher_mask != 0)
            g = losses.gate(lp, teacher, options.opd_beta, options.gate, h)
            opd = torch.where(m, g * (teacher - lp), 0.0)
            sums["teacher_weight"] = (w * m).sum()
            sums["gate"] = (w * torch.where(m, g, 0.0)).sum()
            sums["opd_term"] = (w * opd).sum()
            if options.opd_coef != 0:
                loss = loss + options.opd_coef * (w * opd).sum()

        leaves = [lp] if h is None else [lp, h]
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)

    a = grads[0] if grads[0] is not None else torch.zeros_like(lp)
    b = grads[1] if h is not None else None
    ratio = terms.ratio.detach()
    sums["clip_frac"] = (w * terms.clipped).sum()
    sums["ratio_min"] = torch.where(active, ratio, torch.inf).amin() if ratio.numel() else _const(torch.inf, w)
    sums["ratio_max"] = torch.where(active, ratio, -torch.inf).amax() if ratio.numel() else _const(-torch.inf, w)
    return loss.detach(), a.detach(), None if b is None else b.detach(), {k: v.detach() for k, v in sums.items()}


def _const(value: float, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32, device=like.device)


def merge_metric_sums(total: MetricSums, part: MetricSums) -> MetricSums:
    """Combine the metric sums of two disjoint token sets."""
    merged = dict(total)
    for key, value in part.items():
        if key not in merged:
            merged[key] = value
        elif key in _MIN_KEYS:
            merged[key] = torch.minimum(merged[key], value)
        elif key in _MAX_KEYS:
            merged[key] = torch.maximum(merged[key], value)
        else:
            merged[key] = merged[key] + value
    return merged


def metric_means(sums: MetricSums) -> dict[str, torch.Tensor]:
    """Weighted means from metric sums (0 where no token carries weight; ratios 1 when no token)."""
    def mean(key: str, denom_key: str) -> torch.Tensor:
        denom = sums[denom_key]
        return torch.where(denom != 0, sums[key] / torch.where(denom != 0, denom, 1.0), 0.0)

    out = {"clip_frac": mean("clip_frac", "weight")}
    for key in ("ratio_min", "ratio_max"):
        out[key] = torch.where(torch.isfinite(sums[key]), sums[key], 1.0)
    for key in ("kl", "entropy"):
        if key in sums:
            out[key] = mean(key, "weight")
    if "gate" in sums:
        out["gate_mean"] = mean("gate", "teacher_weight")
    if "opd_term" in sums:
        out["opd_term"] = mean("opd_term", "teacher_weight")
    return out
