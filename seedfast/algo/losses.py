"""The per-token loss terms of docs/algorithms.md ('Policy loss', 'OPD gate') in plain torch, and their composition.

    L = agg(pg + kl_coef·kl − entropy_coef·H) + opd_coef·agg(opd)

All inputs are per-token `[B, T]` tensors (one sequence per row), `mask [B, T]` marks the response
tokens (bool, or numeric with nonzero = valid). This module is the reference that the fused
token-loss kernel is tested against: every function here is written to be read next to docs/algorithms.md.

Numerics: terms are computed in fp32 (fp64 when an input is fp64). Values at masked positions are
replaced by 0 before any arithmetic, so padding may hold anything (−inf, NaN) without leaking into
the loss or its gradient.

Metrics are returned as detached 0-dim tensors (fp32/fp64) so that nothing forces a host sync;
call `.item()` when logging. They are local means over this call's valid tokens (not global).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ._checks import check_2d, check_count, check_mask, check_option, check_same_shape, check_tensor, compute_dtype
from .aggregation import AGG_MODES, Count, aggregate, aggregation_weights

__all__ = [
    "AGG_MODES", "DIVERGENCE_MODES", "GATES", "KL_KINDS", "OPD_MODES", "PLAIN_PPO", "LossOptions", "PolicyTerms",
    "aggregate", "aggregation_weights", "gate", "kl_penalty", "opd_advantage_shift", "opd_loss", "policy_loss",
    "policy_terms", "soft_or", "total_loss",
]

KL_KINDS = ("low_var_kl", "k3", "k1", "k2")  # "k3" is another name for "low_var_kl"
GATES = ("gap", "entropy", "soft_or")
# The forms of the teacher term (docs/algorithms.md, 'Forms of the teacher term'): the paper's gated self-imitation,
# the signed per-token shift folded into the advantage, and two full-vocabulary divergences computed by
# seedfast.ops.fused_divergence from the student's and the teacher's hidden states.
OPD_MODES = ("gate", "advantage", "reverse_kl", "jsd")
DIVERGENCE_MODES = ("reverse_kl", "jsd")

# exp(±20) is finite in fp32, and beyond it every branch is clipped anyway; without this clamp a
# ratio of inf makes the backward of exp compute 0·inf = NaN.
MAX_LOG_RATIO = 20.0
KL_CLAMP = 10.0

Metrics = dict[str, torch.Tensor]


@dataclass(frozen=True)
class LossOptions:
    """The scalar knobs of the per-token loss (docs/algorithms.md, 'Policy loss', 'OPD gate'), one value for every
    function that computes it: total_loss here, seedfast.ops.fused_loss, its backends' token_loss and the
    tensor-parallel head's tp_fused_loss. The defaults are plain PPO / GRPO (every coefficient 0); the run's values
    come from the `loss:` config (train/update.py loss_options). Each function checks the options it is given.

    Aggregation is not an option here: the fused ops take it as per-token weights (aggregation_weights), and
    total_loss as its own argument.
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = 3.0  # None: no dual clip
    kl_coef: float = 0.0
    kl_kind: str = "low_var_kl"
    entropy_coef: float = 0.0
    opd_coef: float = 0.0
    opd_beta: float = 5.0
    gate: str = "gap"
    opd_mode: str = "gate"  # OPD_MODES; the divergence forms add their term outside the per-token loss
    opd_adv_clip: float = 3.0  # `advantage`: |ℓskill − ℓold| is clipped to this many nats before λ multiplies it
    opd_jsd_beta: float = 0.5  # `jsd`: the generalized JSD's β (TRL's GKD: 0 forward KL, 1 reverse KL)


PLAIN_PPO = LossOptions()  # the default of every loss function (a module-level value: a frozen dataclass is shared)


# ---------------------------------------------------------------------------------------------
# Policy term (PPO clip + dual clip)

class PolicyTerms(NamedTuple):
    pg: torch.Tensor            # per-token policy loss
    log_ratio: torch.Tensor     # ℓθ − ℓold, clamped to ±MAX_LOG_RATIO
    ratio: torch.Tensor         # ρ = exp(log_ratio)
    clipped: torch.Tensor       # bool: the clipped branch of the max was taken (strictly larger)
    dual_clipped: torch.Tensor  # bool: A < 0 and the dual-clip cap −A·c was taken


def policy_terms(logprob: torch.Tensor, old_logprob: torch.Tensor, advantages: torch.Tensor,
                 clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = 3.0) -> PolicyTerms:
    """Per-token PPO terms on already-checked, broadcastable tensors (no masking, no aggregation).

    pg = max(−A·ρ, −A·clip(ρ, 1−clip_low, 1+clip_high)); for A < 0 also pg = min(pg, −A·dual_clip).
    """
    log_ratio = (logprob - old_logprob).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(unclipped, clipped)
    clipped_taken = clipped > unclipped
    if dual_clip is None:
        return PolicyTerms(pg, log_ratio, ratio, clipped_taken, torch.zeros_like(clipped_taken))
    cap = -advantages * dual_clip
    dual_taken = (advantages < 0) & (pg > cap)
    return PolicyTerms(torch.where(dual_taken, cap, pg), log_ratio, ratio, clipped_taken, dual_taken)


def _check_clip(func: str, clip_low: float, clip_high: float, dual_clip: float | None) -> None:
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"{func}: clip_low must be in [0, 1), got {clip_low}")
    if clip_high < 0.0:
        raise ValueError(f"{func}: clip_high must be >= 0, got {clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"{func}: dual_clip must be > 1 (or None to turn it off), got {dual_clip}")


def _masked_mean(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return (torch.where(valid, x, 0.0).sum() / valid.sum().clamp_min(1)).detach()


def _policy_metrics(terms: PolicyTerms, valid: torch.Tensor) -> Metrics:
    ratio, log_ratio = terms.ratio.detach(), terms.log_ratio.detach()
    any_valid = valid.any()
    one = torch.ones((), dtype=ratio.dtype, device=ratio.device)
    return {
        "clip_frac": _masked_mean(terms.clipped.to(ratio.dtype), valid),
        "dual_clip_frac": _masked_mean(terms.dual_clipped.to(ratio.dtype), valid),
        # With no valid token, min/max report the on-policy ratio 1 rather than ±inf.
        "ratio_min": torch.where(any_valid, torch.where(valid, ratio, torch.inf).min(), one),
        "ratio_max": torch.where(any_valid, torch.where(valid, ratio, -torch.inf).max(), one),
        "ratio_mean": _masked_mean(ratio, valid),
        # k3 estimate of KL(π_old ‖ π_θ) on samples of π_old: ρ − 1 − log ρ (≥ 0).
        "approx_kl": _masked_mean(ratio - 1.0 - log_ratio, valid),
    }


# ---------------------------------------------------------------------------------------------
# Input checking shared by the public losses

def _per_token_inputs(func: str, logprob: torch.Tensor, mask: torch.Tensor,
                      **others: torch.Tensor | None) -> tuple[torch.Tensor, torch.dtype]:
    check_tensor(func, "logprob", logprob)
    check_2d(func, "logprob", logprob)
    for name, t in others.items():
        if t is not None:
            check_tensor(func, name, t)
    check_same_shape(func, "logprob", logprob, **others)
    valid = check_mask(func, "mask", mask, logprob, "logprob")
    return valid, compute_dtype(logprob, *others.values())


def _advantages_per_token(func: str, advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    check_tensor(func, "advantages", advantages)
    if advantages.shape == like.shape:
        return advantages
    if advantages.shape == like.shape[:1]:
        return advantages[:, None].expand_as(like)
    raise ValueError(f"{func}: advantages has shape {tuple(advantages.shape)}; expected ({like.shape[0]},) "
                     f"or {tuple(like.shape)} to match logprob")


def _teacher_valid(func: str, teacher_mask: torch.Tensor | None, valid: torch.Tensor) -> torch.Tensor:
    """m_t = response mask × teacher-valid mask; teacher_mask is per sample [B] or per token [B, T]."""
    if teacher_mask is None:
        return valid
    check_tensor(func, "teacher_mask", teacher_mask, floating=False)
    tmask = teacher_mask if teacher_mask.dtype == torch.bool else teacher_mask != 0
    if tmask.shape == valid.shape[:1]:
        tmask = tmask[:, None]
    elif tmask.shape != valid.shape:
        raise ValueError(f"{func}: teacher_mask has shape {tuple(teacher_mask.shape)}; expected "
                         f"({valid.shape[0]},) or {tuple(valid.shape)} to match logprob")
    return valid & tmask


def _clean(x: torch.Tensor | None, valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    return None if x is None else torch.where(valid, x.to(dtype), 0.0)


def policy_loss(logprob: torch.Tensor, old_logprob: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = 3.0,
                agg: str = "token-mean", global_tokens: Count = None,
                global_seqs: Count = None) -> tuple[torch.Tensor, Metrics]:
    """agg(pg) over the valid tokens; advantages are per sample [B] or per token [B, T].

    Metrics: clip_frac, dual_clip_frac (fractions of valid tokens), ratio_min/max/mean, approx_kl.
    """
    func = "policy_loss"
    _check_clip(func, clip_low, clip_high, dual_clip)
    check_option(func, "agg", agg, AGG_MODES)
    check_count(func, "global_tokens", global_tokens)
    check_count(func, "global_seqs", global_seqs)
    valid, dtype = _per_token_inputs(func, logprob, mask, old_logprob=old_logprob)
    adv = _advantages_per_token(func, advantages, logprob)
    lp, old, adv = (_clean(x, valid, dtype) for x in (logprob, old_logprob, adv))
    terms = policy_terms(lp, old, adv, clip_low, clip_high, dual_clip)
    loss = aggregate(terms.pg, valid, agg, global_tokens, global_seqs)
    return loss, _policy_metrics(terms, valid)


# ---------------------------------------------------------------------------------------------
# KL to the reference policy

def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate (same shape as the inputs; mask it yourself).

    k1 = ℓθ − ℓref;  k2 = ½(ℓθ − ℓref)²;  low_var_kl (k3): r = ℓref − ℓθ, clamp(exp(r) − r − 1, ±10).
    """
    func = "kl_penalty"
    check_option(func, "kind", kind, KL_KINDS)
    check_tensor(func, "logprob", logprob)
    check_tensor(func, "ref_logprob", ref_logprob)
    check_same_shape(func, "logprob", logprob, ref_logprob=ref_logprob)
    dtype = compute_dtype(logprob, ref_logprob)
    diff = logprob.to(dtype) - ref_logprob.to(dtype)
    if kind == "k1":
        return diff
    if kind == "k2":
        return 0.5 * diff.square()
    # Clamping r to ±20 changes no value (exp(r) − r − 1 > 10 there already) but keeps exp finite,
    # so the backward never multiplies 0 by inf.
    r = (-diff).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return (torch.exp(r) - r - 1.0).clamp(-KL_CLAMP, KL_CLAMP)


# ---------------------------------------------------------------------------------------------
# On-policy distillation (SEED, SDAR)

def gate(logprob: torch.Tensor, teacher_logprob: torch.Tensor, beta: float = 5.0, kind: str = "gap",
         entropy: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token OPD gate g_t in (0, 1), detached (no gradient reaches any input).

    Δ = sg[ℓskill − ℓθ];  gap: σ(β·Δ);  entropy: σ(β·sg[H]);  soft_or: σ(β·[1 − (1 − Ĥ)(1 − Δ̂)]) with both
    inputs in [0, 1): Ĥ = 1 − e^(−sg[H]), Δ̂ = 1 − e^(−max(Δ, 0)) (docs/algorithms.md, 'OPD gate').
    """
    func = "gate"
    check_option(func, "kind", kind, GATES)
    check_tensor(func, "logprob", logprob)
    check_tensor(func, "teacher_logprob", teacher_logprob)
    if kind != "gap" and entropy is None:
        raise ValueError(f"{func}: kind={kind!r} needs entropy (the student entropy H_t per token)")
    if entropy is not None:
        check_tensor(func, "entropy", entropy)
    check_same_shape(func, "logprob", logprob, teacher_logprob=teacher_logprob, entropy=entropy)
    dtype = compute_dtype(logprob, teacher_logprob, entropy)
    h = None if entropy is None else entropy.to(dtype)
    return _gate_values(logprob.to(dtype), teacher_logprob.to(dtype), beta, kind, h)


def _gate_values(logprob: torch.Tensor, teacher_logprob: torch.Tensor, beta: float, kind: str,
                 entropy: torch.Tensor | None) -> torch.Tensor:
    with torch.no_grad():
        delta = teacher_logprob - logprob
        if kind == "gap":
            return torch.sigmoid(beta * delta)
        if kind == "entropy":
            return torch.sigmoid(beta * entropy)
        return torch.sigmoid(beta * soft_or(entropy, delta))


def soft_or(entropy: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """1 − (1 − Ĥ)(1 − Δ̂), Ĥ = 1 − e^(−H), Δ̂ = 1 − e^(−max(Δ, 0)): a probabilistic OR of two numbers in [0, 1),
    so it never decreases when either input grows; the product is e^(−(H + max(Δ, 0))). Raw nats are not in
    [0, 1] and made the plain product non-monotone (docs/algorithms.md, 'OPD gate')."""
    return 1.0 - torch.exp(-(entropy.clamp_min(0.0) + delta.clamp_min(0.0)))


def opd_advantage_shift(teacher_logprob: torch.Tensor, old_logprob: torch.Tensor, teacher_valid: torch.Tensor,
                        coef: float, clip: float) -> torch.Tensor:
    """The `advantage` form's per-token shift λ·m·clip(sg[ℓskill] − sg[ℓold], ±clip), added to the advantage inside
    the clipped policy term (docs/algorithms.md, 'Forms of the teacher term'); detached, 0 where m is False."""
    with torch.no_grad():
        delta = (teacher_logprob - old_logprob).clamp(-clip, clip)
        return torch.where(teacher_valid, coef * delta, 0.0)


def opd_loss(logprob: torch.Tensor, teacher_logprob: torch.Tensor, mask: torch.Tensor, beta: float = 5.0,
             gate: str = "gap", entropy: torch.Tensor | None = None, agg: str = "token-mean",
             global_tokens: Count = None, global_seqs: Count = None,
             teacher_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, Metrics]:
    """agg(opd) with opd_t = m_t · g_t · (sg[ℓskill_t] − ℓθ_t); the gradient reaches only ℓθ.

    m_t = mask × teacher_mask. The aggregation counts the tokens of `mask` (the response mask), so
    samples whose skill failed to parse dilute the term exactly as they do the policy term, and one
    global token count serves both. Pass the product as `mask` to count teacher-valid tokens only.
    Metrics over teacher-valid tokens: gate_mean, gap_mean (mean Δ), opd_term (mean g·(ℓskill − ℓθ)),
    teacher_valid_frac (teacher-valid / response tokens).
    """
    func = "opd_loss"
    check_option(func, "gate", gate, GATES)
    check_option(func, "agg", agg, AGG_MODES)
    check_count(func, "global_tokens", global_tokens)
    check_count(func, "global_seqs", global_seqs)
    valid, dtype = _per_token_inputs(func, logprob, mask, teacher_logprob=teacher_logprob, entropy=entropy)
    if gate != "gap" and entropy is None:
        raise ValueError(f"{func}: gate={gate!r} needs entropy (the student entropy H_t per token)")
    m = _teacher_valid(func, teacher_mask, valid)
    lp, teacher, h = (_clean(x, m, dtype) for x in (logprob, teacher_logprob, entropy))
    g = _gate_values(lp, teacher, beta, gate, h)
    gap = teacher.detach() - lp
    opd = torch.where(m, g * gap, 0.0)
    loss = aggregate(opd, valid, agg, global_tokens, global_seqs)
    metrics = {
        "gate_mean": _masked_mean(g, m),
        "gap_mean": _masked_mean(gap, m),
        "opd_term": _masked_mean(opd, m),
        "teacher_valid_frac": (m.sum() / valid.sum().clamp_min(1)).to(dtype),
    }
    return loss, metrics


# ---------------------------------------------------------------------------------------------
# The whole loss

def total_loss(logprob: torch.Tensor, old_logprob: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
               *, entropy: torch.Tensor | None = None, ref_logprob: torch.Tensor | None = None,
               teacher_logprob: torch.Tensor | None = None, teacher_mask: torch.Tensor | None = None,
               options: LossOptions = PLAIN_PPO, agg: str = "token-mean", global_tokens: Count = None,
               global_seqs: Count = None) -> tuple[torch.Tensor, Metrics]:
    """L = agg(pg + kl_coef·kl − entropy_coef·H) + opd_coef·agg(opd)

    The loss of docs/algorithms.md, 'Total loss and aggregation', with the knobs of `options`. With opd_mode
    "advantage" there is no opd term: the teacher's shift λ·m·clip(sg[ℓskill] − ℓold) joins the advantage of pg
    (metric opd_term: its mean over teacher-valid tokens). The divergence forms need hidden states, not this function.

    Coefficients default to 0 (plain PPO/GRPO); the run defaults are kl_coef 0.01, entropy_coef 0.001,
    opd_coef 0.01, opd_beta 5.0. A nonzero coefficient needs its tensor (ref_logprob, entropy,
    teacher_logprob). A tensor given with a zero coefficient only adds its metrics.
    Metrics: loss, pg_loss and those of policy_loss; kl (mean over valid tokens) with ref_logprob;
    entropy (mean) with entropy; opd_loss and those of opd_loss with teacher_logprob.
    """
    func = "total_loss"
    _check_clip(func, options.clip_low, options.clip_high, options.dual_clip)
    check_option(func, "agg", agg, AGG_MODES)
    check_option(func, "kl_kind", options.kl_kind, KL_KINDS)
    check_option(func, "gate", options.gate, GATES)
    check_option(func, "opd_mode", options.opd_mode, OPD_MODES)
    if options.opd_mode in DIVERGENCE_MODES:
        raise ValueError(f"{func}: opd_mode={options.opd_mode!r} is a full-vocabulary divergence: it needs the "
                         "student's and the teacher's hidden states (seedfast.ops.fused_divergence), not per-token "
                         "log-probs")
    check_count(func, "global_tokens", global_tokens)
    check_count(func, "global_seqs", global_seqs)
    for coef, name, tensor in ((options.kl_coef, "ref_logprob", ref_logprob),
                               (options.entropy_coef, "entropy", entropy),
                               (options.opd_coef, "teacher_logprob", teacher_logprob)):
        if coef != 0 and tensor is None:
            raise ValueError(f"{func}: a nonzero coefficient for {name} was given ({coef}) but {name} is None")
    if teacher_logprob is not None and options.opd_mode == "gate" and options.gate != "gap" and entropy is None:
        raise ValueError(f"{func}: gate={options.gate!r} needs entropy (the student entropy H_t per token)")
    valid, dtype = _per_token_inputs(func, logprob, mask, old_logprob=old_logprob, entropy=entropy,
                                     ref_logprob=ref_logprob, teacher_logprob=teacher_logprob)
    adv = _advantages_per_token(func, advantages, logprob)
    lp, old, adv, h, ref = (_clean(x, valid, dtype) for x in (logprob, old_logprob, adv, entropy, ref_logprob))

    shift = None
    if teacher_logprob is not None and options.opd_mode == "advantage":
        m = _teacher_valid(func, teacher_mask, valid)
        shift = opd_advantage_shift(_clean(teacher_logprob, m, dtype), old, m, options.opd_coef, options.opd_adv_clip)
        adv = adv + shift
    terms = policy_terms(lp, old, adv, options.clip_low, options.clip_high, options.dual_clip)
    per_token = terms.pg
    metrics = _policy_metrics(terms, valid)
    metrics["pg_loss"] = aggregate(terms.pg, valid, agg, global_tokens, global_seqs).detach()
    if ref is not None:
        kl = kl_penalty(lp, ref, options.kl_kind)
        metrics["kl"] = _masked_mean(kl, valid)
        if options.kl_coef != 0:
            per_token = per_token + options.kl_coef * kl
    if h is not None:
        metrics["entropy"] = _masked_mean(h, valid)
        if options.entropy_coef != 0:
            per_token = per_token - options.entropy_coef * h
    loss = aggregate(per_token, valid, agg, global_tokens, global_seqs)

    if shift is not None:
        metrics["opd_term"] = _masked_mean(shift, m)
        metrics["teacher_valid_frac"] = (m.sum() / valid.sum().clamp_min(1)).to(dtype)
    elif teacher_logprob is not None:
        opd, opd_metrics = opd_loss(lp, teacher_logprob, valid, options.opd_beta, options.gate, h, agg, global_tokens,
                                    global_seqs, teacher_mask)
        metrics.update(opd_metrics)
        metrics["opd_loss"] = opd.detach()
        if options.opd_coef != 0:
            loss = loss + options.opd_coef * opd
    metrics["loss"] = loss.detach()
    return loss, metrics
