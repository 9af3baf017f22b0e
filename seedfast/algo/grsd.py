"""GRSD: sign-preserving turn-level advantage modulation and reflection advantages (docs/algorithms.md, 'GRSD')."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._checks import check_2d, check_mask, check_same_shape, check_tensor
from .advantage import GroupIds, group_index, group_normalize

MAX_Q = 20.0          # expm1(20) ≈ 4.9e8: finite, and the result is clipped to ±g_max anyway
MIN_MULTIPLIER = 0.1  # Â = A · max(1 + λ·ĝ, 0.1): the sign of A never flips


def _check_1d(func: str, name: str, tensor: torch.Tensor, floating: bool = True) -> None:
    check_tensor(func, name, tensor, floating=floating)
    if tensor.dim() != 1:
        raise ValueError(f"{func}: {name} must be [S] (1-D), got shape {tuple(tensor.shape)}")


def has_contrast(success: torch.Tensor, group_ids: GroupIds) -> torch.Tensor:
    """`[S]` bool: the sample's group has at least one success and at least one failure."""
    func = "grsd.has_contrast"
    _check_1d(func, "success", success, floating=False)
    ok = success if success.dtype == torch.bool else success != 0
    codes, num_groups = group_index(group_ids, ok.shape[0], ok.device, func)
    wins = torch.zeros(num_groups, dtype=torch.long, device=ok.device).index_add_(0, codes, ok.long())
    count = torch.zeros(num_groups, dtype=torch.long, device=ok.device).index_add_(0, codes, torch.ones_like(codes))
    return ((wins > 0) & (wins < count))[codes]


def contrast_groups(success: Sequence[bool], group_ids: Sequence[int]) -> set[int]:
    """The groups (ids) with at least one success and at least one failure among their trajectories."""
    if len(success) != len(group_ids):
        raise ValueError(f"grsd.contrast_groups: {len(success)} successes but {len(group_ids)} group ids")
    if not success:
        return set()
    contrast = has_contrast(torch.tensor([bool(s) for s in success]), list(group_ids))
    return {g for g, c in zip(group_ids, contrast.tolist()) if c}


def turn_delta(guide_logprob: torch.Tensor, old_logprob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """δ per sample `[B]`: mean over action tokens of ℓguide − mean over action tokens of ℓold.

    Detached (a no-grad signal); 0 for samples without an action token.
    """
    func = "grsd.turn_delta"
    check_tensor(func, "guide_logprob", guide_logprob)
    check_tensor(func, "old_logprob", old_logprob)
    check_2d(func, "guide_logprob", guide_logprob)
    check_same_shape(func, "guide_logprob", guide_logprob, old_logprob=old_logprob)
    valid = check_mask(func, "mask", mask, guide_logprob, "guide_logprob")
    with torch.no_grad():
        diff = torch.where(valid, guide_logprob.float() - old_logprob.float(), 0.0)
        return diff.sum(dim=1) / valid.sum(dim=1).clamp_min(1)


def modulate(advantages: torch.Tensor, delta: torch.Tensor, group_ids: GroupIds, contrast: torch.Tensor,
             lam: float = 0.5, g_max: float = 0.2, eta: float = 0.0, eps: float = 1e-6) -> torch.Tensor:
    """Turn-level modulated advantages `[S]`:

    q = sign(A)·δ;  q' = expm1(clamp(q, ±20));  q̂ = q' / (mean_group |q'| + ε);  q̂ = 0 where |q̂| ≤ η;
    ĝ = clip(q̂, ±g_max);  Â = A · max(1 + λ·ĝ, 0.1).  Samples of groups without contrast keep A.
    `contrast [S]` must be the same for every sample of a group (see has_contrast); δ of samples
    without contrast is not read (it may be NaN).
    """
    func = "grsd.modulate"
    _check_1d(func, "advantages", advantages)
    _check_1d(func, "delta", delta)
    _check_1d(func, "contrast", contrast, floating=False)
    check_same_shape(func, "advantages", advantages, delta=delta, contrast=contrast)
    for name, value in (("g_max", g_max), ("eta", eta), ("eps", eps)):
        if value < 0:
            raise ValueError(f"{func}: {name} must be >= 0, got {value}")
    contrast = contrast if contrast.dtype == torch.bool else contrast != 0
    codes, num_groups = group_index(group_ids, advantages.shape[0], advantages.device, func)

    def group_sum(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(num_groups, dtype=x.dtype, device=x.device).index_add_(0, codes, x)

    size = group_sum(torch.ones_like(codes))
    with_contrast = group_sum(contrast.long())
    mixed = ((with_contrast > 0) & (with_contrast < size)).nonzero()
    if mixed.numel():
        i = int((codes == mixed[0, 0]).nonzero()[0, 0])
        raise ValueError(f"{func}: contrast differs within the group of sample {i}; it must be one value per group")
    bad = (contrast & ~torch.isfinite(delta)).nonzero()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(f"{func}: delta[{i}] = {delta[i].item()} is not finite in a group with contrast")

    a = advantages.to(torch.float64)
    d = torch.where(contrast, delta.to(torch.float64), 0.0)
    q = torch.sign(a) * d
    q_exp = torch.expm1(q.clamp(-MAX_Q, MAX_Q))
    mean_abs = group_sum(q_exp.abs()) / size.clamp_min(1)
    q_hat = q_exp / (mean_abs[codes] + eps)
    q_hat = torch.where(q_hat.abs() <= eta, 0.0, q_hat)
    g = q_hat.clamp(-g_max, g_max)
    modulated = a * (1.0 + lam * g).clamp_min(MIN_MULTIPLIER)
    return torch.where(contrast, modulated, a).to(advantages.dtype)


def reflection_advantages(scores: torch.Tensor, group_ids: GroupIds, eps: float = 1e-6) -> torch.Tensor:
    """Judge scores `[S]` normalized within group, (s − mean)/(std + ε) over the valid scores (NaN = unscored),
    std the population std (÷ n, `np.std`) as in the GRSD reference code. 0 for unscored entries, groups with
    < 2 valid scores, zero variance."""
    func = "grsd.reflection_advantages"
    _check_1d(func, "scores", scores)
    bad = torch.isinf(scores).nonzero()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(f"{func}: scores[{i}] = {scores[i].item()} is infinite (use NaN for an invalid score)")
    return group_normalize(scores, group_ids, ~torch.isnan(scores), "mean_std", eps, unbiased=False)
