"""Group-relative advantages (GRPO; docs/algorithms.md, 'Advantages (GRPO)').

`A_i = (R_i − mean_g) / (std_g + ε)` over the step samples of group g, `std_g` the sample
(unbiased) standard deviation. A group of one sample, or whose rewards are all equal, gets 0
(it carries no relative signal; the reference code gives a lone sample its raw reward instead).

A per-step penalty (e.g. −0.1 for an invalid action) enters in one of two ways (`grpo_with_penalty`):
- `after_norm` (default): the outcome is normalized within the group and the raw penalty is subtracted
  afterwards, `A_i = norm_g(R_i) − pen_i`. The penalty can never outweigh the outcome: in a group where
  nobody wins, valid steps get 0 and invalid ones −pen (never a win-sized advantage).
- `in_reward` (the reference code): `A_i = norm_g(R_i − pen_i)`. In a group where nobody wins the std is
  that of the penalties alone, so dividing by it makes a 0.1 penalty as large as a win, and every valid
  but useless step gets a positive advantage (reward hacking: docs/algorithms.md, "Step penalties").
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from ._checks import check_2d, check_mask, check_option, check_tensor

NORMS = ("mean_std", "mean")
PENALTY_MODES = ("after_norm", "in_reward")

GroupIds = torch.Tensor | Sequence[Hashable]


def group_index(group_ids: GroupIds, num_samples: int, device: torch.device | str = "cpu",
                func: str = "group_index") -> tuple[torch.Tensor, int]:
    """Dense group codes `[S]` (int64, 0..G-1 in order of first appearance) and G.

    `group_ids` is an integer tensor `[S]` or a sequence of S hashables (task names, uids, ...).
    """
    if isinstance(group_ids, torch.Tensor):
        if group_ids.is_floating_point() or group_ids.is_complex():
            raise TypeError(f"{func}: group_ids must be an integer tensor or a list of hashables, "
                            f"got a tensor of dtype {group_ids.dtype}")
        if group_ids.dim() != 1 or group_ids.numel() != num_samples:
            raise ValueError(f"{func}: group_ids has shape {tuple(group_ids.shape)}; expected ({num_samples},), "
                             "one id per sample")
        ids = group_ids.tolist()
    elif isinstance(group_ids, (str, bytes)) or not isinstance(group_ids, Sequence):
        raise TypeError(f"{func}: group_ids must be an integer tensor or a list of hashables, "
                        f"got {type(group_ids).__name__}")
    else:
        ids = list(group_ids)
        if len(ids) != num_samples:
            raise ValueError(f"{func}: group_ids has {len(ids)} entries; expected {num_samples}, one per sample")
    codes: dict[Hashable, int] = {}
    try:
        index = [codes.setdefault(g, len(codes)) for g in ids]
    except TypeError as err:
        raise TypeError(f"{func}: group_ids entries must be hashable ({err})") from None
    return torch.tensor(index, dtype=torch.long, device=device), len(codes)


def group_normalize(values: torch.Tensor, group_ids: GroupIds, valid: torch.Tensor | None = None,
                    norm: str = "mean_std", eps: float = 1e-6, unbiased: bool = True) -> torch.Tensor:
    """Normalize `values [S]` within groups over the `valid` entries; 0 for invalid entries, for groups
    with fewer than 2 valid entries and for groups whose valid entries are all equal. No NaN.
    `unbiased`: the std divides by n − 1 (GRPO), else by n (the population std, `np.std`)."""
    func = "group_normalize"
    check_tensor(func, "values", values, floating=False)
    if values.dim() != 1:
        raise ValueError(f"{func}: values must be [S] (1-D), got shape {tuple(values.shape)}")
    check_option(func, "norm", norm, NORMS)
    n = values.shape[0]
    codes, num_groups = group_index(group_ids, n, values.device, func)
    if valid is None:
        valid = torch.ones(n, dtype=torch.bool, device=values.device)
    else:
        valid = check_mask(func, "valid", valid, values, "values")
    v = torch.where(valid, values.to(torch.float64), 0.0)
    w = valid.to(torch.float64)

    def group_sum(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(num_groups, dtype=torch.float64, device=v.device).index_add_(0, codes, x)

    count = group_sum(w)
    mean = group_sum(v) / count.clamp_min(1)
    centered = torch.where(valid, v - mean[codes], 0.0)
    std = (group_sum(centered.square()) / (count - int(unbiased)).clamp_min(1)).sqrt()
    # All-equal groups are detected exactly (max == min): their float mean need not equal the values.
    vmax = torch.full((num_groups,), -torch.inf, dtype=torch.float64, device=v.device)
    vmin = torch.full((num_groups,), torch.inf, dtype=torch.float64, device=v.device)
    vmax = vmax.scatter_reduce(0, codes, torch.where(valid, v, -torch.inf), "amax")
    vmin = vmin.scatter_reduce(0, codes, torch.where(valid, v, torch.inf), "amin")
    informative = (count >= 2) & (vmax > vmin)

    scaled = centered / (std[codes] + eps) if norm == "mean_std" else centered
    out = torch.where(valid & informative[codes], scaled, 0.0)
    return out.to(values.dtype if values.is_floating_point() else torch.float32)


def grpo(rewards: torch.Tensor, group_ids: GroupIds, norm: str = "mean_std", eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantages `[S]` from per-sample rewards `[S]` (see module docstring)."""
    func = "advantage.grpo"
    check_tensor(func, "rewards", rewards, floating=False)
    if rewards.dim() != 1:
        raise ValueError(f"{func}: rewards must be [S] (1-D), got shape {tuple(rewards.shape)}")
    check_option(func, "norm", norm, NORMS)
    if eps < 0:
        raise ValueError(f"{func}: eps must be >= 0, got {eps}")
    bad = (~torch.isfinite(rewards.to(torch.float64))).nonzero()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(f"{func}: rewards[{i}] = {rewards[i].item()} is not finite")
    return group_normalize(rewards, group_ids, None, norm, eps)


def per_token(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Broadcast per-sample advantages `[B]` to the valid tokens of `mask [B, T]` (0 elsewhere)."""
    func = "advantage.per_token"
    check_tensor(func, "advantages", advantages)
    check_tensor(func, "mask", mask, floating=False)
    check_2d(func, "mask", mask)
    if advantages.shape != mask.shape[:1]:
        raise ValueError(f"{func}: advantages has shape {tuple(advantages.shape)} but mask has shape "
                         f"{tuple(mask.shape)}; expected advantages of shape ({mask.shape[0]},)")
    valid = check_mask(func, "mask", mask, mask, "mask")
    return torch.where(valid, advantages[:, None], 0.0)


def grpo_with_penalty(outcomes: torch.Tensor, penalties: torch.Tensor, group_ids: GroupIds,
                      norm: str = "mean_std", eps: float = 1e-6, penalty_mode: str = "after_norm") -> torch.Tensor:
    """GRPO advantages `[S]` from outcomes `[S]` and per-step penalties `[S]` (>= 0), see module docstring."""
    func = "advantage.grpo_with_penalty"
    check_tensor(func, "penalties", penalties, floating=False)
    check_option(func, "penalty_mode", penalty_mode, PENALTY_MODES)
    if penalties.shape != outcomes.shape:
        raise ValueError(f"{func}: penalties has shape {tuple(penalties.shape)} but outcomes has shape "
                         f"{tuple(outcomes.shape)}; expected one penalty per sample")
    if bool((penalties < 0).any()):
        i = int((penalties < 0).nonzero()[0])
        raise ValueError(f"{func}: penalties[{i}] = {penalties[i].item()} is negative; a penalty is subtracted")
    pen = penalties.to(torch.float32)
    if penalty_mode == "in_reward":
        return grpo(outcomes.to(torch.float32) - pen, group_ids, norm, eps)
    return grpo(outcomes, group_ids, norm, eps).to(torch.float32) - pen
