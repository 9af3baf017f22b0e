"""Train/rollout mismatch correction (docs/algorithms.md, 'Rollout correction') in plain torch.

The rollout engine samples token y_t with its own numbers, log-prob ℓrollout_t (the behaviour policy μ); the trainer
scores the same token under θ_old, ℓtrain_t. With log ρ_t = ℓtrain_t − ℓrollout_t (clamped to ±MAX_LOG_RATIO):

    none          w_t = 1
    token_tis     w_t = min(ρ_t, token_clip)                                  (truncated IS, per token)
    seq_tis       w_t = min(exp(Σ_s log ρ_s), seq_clip)                        (truncated IS, per sequence)
    seq_geo_mask  w_t = 1[geo_low ≤ exp(mean_s log ρ_s) ≤ geo_high]           (geometric-mean sequence mask)
    token_mask    w_t = ρ_t · 1[token_low ≤ ρ_t ≤ token_high]                (IcePop: two-sided token mask)

w is stop-gradient. It multiplies the policy (PG) term; a token whose w is 0 is dropped from every term of the loss
(train/update.py: the masking rule). Inputs are [B, T] (one row per step sample) with a mask of the response tokens,
as in losses.py; values at masked positions may hold anything. The sequence of the seq_* modes is a row, or, given
`groups` [B], every row of one group together (the rows of one trajectory: Σ_s and mean_s run over all of them).

The diagnostics are sums (`CorrectionSums`), so micro-batches and data-parallel ranks add them up before
`correction_metrics` turns them into means: the gap |ℓtrain − ℓrollout| (mean, max), the k3 estimate of
KL(rollout ‖ train) = E_μ[ρ − 1 − log ρ], both perplexities (mean over sequences of exp(−mean_t ℓ)), and the shares
of tokens and sequences the correction masked (weight 0) or truncated (weight cut to its threshold).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ._checks import check_2d, check_mask, check_option, check_same_shape, check_tensor
from .losses import MAX_LOG_RATIO

__all__ = ["MODES", "Correction", "CorrectionOptions", "CorrectionSums", "correction_metrics", "merge_sums",
           "rollout_correction"]

MODES = ("none", "token_tis", "seq_tis", "seq_geo_mask", "token_mask")

CorrectionSums = dict[str, torch.Tensor]
# the sums that merge by max (every other one adds)
_MAX_KEYS = ("gap_max",)
SUM_KEYS = ("tokens", "seqs", "gap_abs", "gap_max", "k3", "train_ppl", "rollout_ppl", "weight", "masked_tokens",
            "truncated_tokens", "masked_seqs", "truncated_seqs")


@dataclass(frozen=True)
class CorrectionOptions:
    """The correction's mode and thresholds (the `rollout.correction` config; train/correction.py reads it)."""

    mode: str = "none"
    token_clip: float = 2.0
    seq_clip: float = 5.0
    geo_low: float = 0.99
    geo_high: float = 1.01
    token_low: float = 0.5
    token_high: float = 5.0

    def check(self, func: str) -> None:
        check_option(func, "mode", self.mode, MODES)
        for name in ("token_clip", "seq_clip", "geo_low", "geo_high", "token_low", "token_high"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{func}: {name} must be > 0, got {getattr(self, name)}")
        for low, high in (("geo_low", "geo_high"), ("token_low", "token_high")):
            if getattr(self, low) > getattr(self, high):
                raise ValueError(f"{func}: {low}={getattr(self, low)} is above {high}={getattr(self, high)}")


NO_CORRECTION = CorrectionOptions()


class Correction(NamedTuple):
    weight: torch.Tensor  # [B, T] stop-gradient weight of the PG term; 0 outside the mask
    masked: torch.Tensor  # [B, T] bool: response tokens the correction gives weight 0
    truncated: torch.Tensor  # [B, T] bool: response tokens whose weight was cut down to the threshold
    sums: CorrectionSums  # the diagnostics' sums (correction_metrics)


def rollout_correction(train_logprob: torch.Tensor, rollout_logprob: torch.Tensor, mask: torch.Tensor,
                       options: CorrectionOptions = NO_CORRECTION, groups: torch.Tensor | None = None) -> Correction:
    """The PG term's per-token weight for `options.mode` and the diagnostics' sums; no gradient reaches any input.

    `groups` [B] (integers): rows with the same value are one sequence for the seq_* modes' weight (the diagnostics
    stay per row). A row without response tokens (an all-False mask row) has no weight and counts in no sequence
    share.
    """
    func = "rollout_correction"
    options.check(func)
    check_tensor(func, "train_logprob", train_logprob)
    check_tensor(func, "rollout_logprob", rollout_logprob)
    check_2d(func, "train_logprob", train_logprob)
    check_same_shape(func, "train_logprob", train_logprob, rollout_logprob=rollout_logprob)
    valid = check_mask(func, "mask", mask, train_logprob, "train_logprob")
    if groups is not None and (groups.shape != train_logprob.shape[:1] or groups.dtype.is_floating_point
                               or (groups.numel() and int(groups.min()) < 0)):
        raise ValueError(f"{func}: groups must be [{train_logprob.shape[0]}] non-negative integers, got "
                         f"{tuple(groups.shape)} {groups.dtype}")
    dtype = torch.promote_types(torch.promote_types(train_logprob.dtype, rollout_logprob.dtype), torch.float32)
    with torch.no_grad():
        train = torch.where(valid, train_logprob.detach().to(dtype), 0.0)
        rollout = torch.where(valid, rollout_logprob.detach().to(dtype), 0.0)
        for name, t in (("train_logprob", train), ("rollout_logprob", rollout)):
            if not torch.isfinite(t).all():
                raise ValueError(f"{func}: {name} holds a non-finite value at a response token")
        weight, truncated = _weights(train - rollout, valid, options, groups)
        masked = valid & (weight == 0)
        return Correction(weight, masked, truncated, _sums(train, rollout, valid, weight, masked, truncated))


def _per_sequence(rows: torch.Tensor, groups: torch.Tensor | None) -> torch.Tensor:
    """[B] per-row sums -> [B, 1]: each row's own, or its group's total."""
    if groups is not None:
        groups = groups.to(rows.device, torch.long)
        totals = torch.zeros(int(groups.max()) + 1 if groups.numel() else 0, dtype=rows.dtype, device=rows.device)
        rows = totals.index_add_(0, groups, rows)[groups]
    return rows[:, None]


def _weights(log_ratio: torch.Tensor, valid: torch.Tensor, options: CorrectionOptions,
             groups: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, truncated) per token; log_ratio is 0 outside `valid`."""
    safe = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ones = valid.to(log_ratio.dtype)
    none = torch.zeros_like(valid)
    if options.mode == "none":
        return ones, none
    if options.mode == "token_tis":
        ratio = torch.exp(safe)
        truncated = valid & (ratio > options.token_clip)
        return torch.where(valid, ratio.clamp(max=options.token_clip), 0.0), truncated
    if options.mode == "token_mask":
        ratio = torch.exp(safe)
        keep = valid & (ratio >= options.token_low) & (ratio <= options.token_high)
        return torch.where(keep, ratio, 0.0), none
    counts = _per_sequence(valid.sum(-1).to(log_ratio.dtype), groups)
    seq_log = _per_sequence(log_ratio.sum(-1), groups)
    if options.mode == "seq_tis":
        ratio = torch.exp(seq_log.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
        truncated = valid & (ratio > options.seq_clip)
        return torch.where(valid, ratio.clamp(max=options.seq_clip), 0.0), truncated
    geo = torch.exp(seq_log / counts.clamp_min(1))  # seq_geo_mask: the geometric mean of the token ratios
    keep = valid & (geo >= options.geo_low) & (geo <= options.geo_high)
    return keep.to(log_ratio.dtype), none


def _sums(train: torch.Tensor, rollout: torch.Tensor, valid: torch.Tensor, weight: torch.Tensor,
          masked: torch.Tensor, truncated: torch.Tensor) -> CorrectionSums:
    log_ratio = train - rollout  # 0 outside valid
    gap = log_ratio.abs()
    safe = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    counts = valid.sum(-1)
    has = counts > 0
    per_seq = counts.clamp_min(1).to(train.dtype)
    zero = torch.zeros((), dtype=train.dtype, device=train.device)
    return {
        "tokens": valid.sum().to(train.dtype),
        "seqs": has.sum().to(train.dtype),
        "gap_abs": gap.sum(),
        "gap_max": gap.max() if gap.numel() else zero,
        "k3": torch.where(valid, torch.exp(safe) - 1.0 - safe, 0.0).sum(),
        "train_ppl": torch.where(has, torch.exp(-train.sum(-1) / per_seq), 0.0).sum(),
        "rollout_ppl": torch.where(has, torch.exp(-rollout.sum(-1) / per_seq), 0.0).sum(),
        "weight": weight.sum(),
        "masked_tokens": masked.sum().to(train.dtype),
        "truncated_tokens": truncated.sum().to(train.dtype),
        # a sequence is masked when every response token of it is (nothing of it reaches the PG term)
        "masked_seqs": (has & (masked.sum(-1) == counts)).sum().to(train.dtype),
        "truncated_seqs": (has & truncated.any(-1)).sum().to(train.dtype),
    }


def merge_sums(total: CorrectionSums | None, part: CorrectionSums) -> CorrectionSums:
    """The sums of two disjoint sets of sequences."""
    if total is None:
        return dict(part)
    return {k: torch.maximum(total[k], part[k]) if k in _MAX_KEYS else total[k] + part[k] for k in SUM_KEYS}


def correction_metrics(sums: CorrectionSums) -> dict[str, float]:
    """Means from the sums: per token (gap_mean, k3_kl, weight_mean, token shares) and per sequence (perplexities,
    sequence shares); {} when there was no response token."""
    tokens, seqs = float(sums["tokens"]), float(sums["seqs"])
    if tokens == 0:
        return {}
    return {
        "gap_mean": float(sums["gap_abs"]) / tokens,
        "gap_max": float(sums["gap_max"]),
        "k3_kl": float(sums["k3"]) / tokens,
        "training_ppl": float(sums["train_ppl"]) / seqs,
        "rollout_ppl": float(sums["rollout_ppl"]) / seqs,
        "weight_mean": float(sums["weight"]) / tokens,
        "token_masked_share": float(sums["masked_tokens"]) / tokens,
        "token_truncated_share": float(sums["truncated_tokens"]) / tokens,
        "seq_masked_share": float(sums["masked_seqs"]) / seqs,
        "seq_truncated_share": float(sums["truncated_seqs"]) / seqs,
    }
