"""Loss aggregation over per-token values `[B, T]` (`agg`: docs/algorithms.md, 'Total loss and aggregation').

Every mode is linear in the values, so it is written as fixed per-token weights:
`aggregate(values, mask, mode) == (values * aggregation_weights(mask, mode)).sum()`.
The fused kernels use the same weights to turn per-token derivatives into ∂L/∂ℓθ_t.

Modes (one sequence per row; rows without a valid token contribute nothing):
- `token-mean`: sum over valid tokens / token count. The count is `global_tokens` when given
  (the valid-token count of the whole mini-batch over all ranks and micro-batches), so the sum of
  the micro-batch losses equals the full-batch loss however the tokens are split.
- `seq-mean-token-mean`: mean over sequences of (sum over its valid tokens / its token count).
- `seq-mean-token-sum`: mean over sequences of (sum over its valid tokens).
For the two seq modes the number of sequences is `global_seqs` when given (global count of rows
with at least one valid token), else the local count of such rows. Each mode reads only its own
global count and ignores the other, so a trainer may always pass both.
"""

from __future__ import annotations

import torch

from ._checks import check_2d, check_count, check_mask, check_option, check_tensor, compute_dtype

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")

Count = int | float | torch.Tensor | None


def aggregation_weights(
    mask: torch.Tensor,
    mode: str = "token-mean",
    global_tokens: Count = None,
    global_seqs: Count = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Per-token weights `[B, T]` (0 on invalid tokens) such that agg(values) == (values * weights).sum()."""
    func = "aggregation_weights"
    check_option(func, "mode", mode, AGG_MODES)
    check_tensor(func, "mask", mask, floating=False)
    check_2d(func, "mask", mask)
    check_count(func, "global_tokens", global_tokens)
    check_count(func, "global_seqs", global_seqs)
    valid = (mask if mask.dtype == torch.bool else mask != 0).to(dtype)

    if mode == "token-mean":
        count = valid.sum() if global_tokens is None else torch.as_tensor(global_tokens, dtype=dtype)
        # An empty batch has a zero numerator; clamping the count keeps the loss 0 instead of NaN.
        return valid / count.to(device=valid.device, dtype=dtype).clamp_min(1)

    tokens_per_seq = valid.sum(dim=1, keepdim=True)
    if global_seqs is None:
        num_seqs = (tokens_per_seq > 0).sum().to(dtype)
    else:
        num_seqs = torch.as_tensor(global_seqs, dtype=dtype).to(valid.device)
    per_seq = valid / num_seqs.clamp_min(1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / tokens_per_seq.clamp_min(1)
    return per_seq


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    global_tokens: Count = None,
    global_seqs: Count = None,
) -> torch.Tensor:
    """0-dim aggregate (fp32, or fp64 for fp64 values) of per-token `values [B, T]` over `mask [B, T]`.

    Values at invalid positions are ignored even if they are inf/NaN (padding may hold anything).
    """
    func = "aggregate"
    check_tensor(func, "values", values)
    check_2d(func, "values", values)
    valid = check_mask(func, "mask", mask, values, "values")
    dtype = compute_dtype(values)
    weights = aggregation_weights(valid, mode, global_tokens, global_seqs, dtype=dtype)
    return (torch.where(valid, values.to(dtype), 0.0) * weights).sum()
