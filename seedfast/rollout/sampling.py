"""Next-token choice from last-position logits: greedy, temperature, top-p (nucleus)."""

from __future__ import annotations

import torch

from seedfast.sampling_params import check_sampling_args


def sample_next(
    logits: torch.Tensor,
    temperature: float,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of `logits` [B, V].

    Returns (tokens [B] int64, logprobs [B] fp32). The log-prob is that of the chosen token under the
    temperature-scaled full distribution (before top-p truncation), i.e. what the trainer recomputes with the
    same temperature; with temperature 0 (greedy) it is the log-prob at temperature 1.
    """
    check_sampling_args(temperature, top_p)
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, V], got shape {tuple(logits.shape)}")
    z = logits.float()
    if temperature > 0:
        z = z / temperature
    logp = torch.log_softmax(z, dim=-1)
    if temperature == 0:
        tokens = torch.argmax(z, dim=-1)
    else:
        tokens = _sample_top_p(logp, top_p, generator)
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


def top_p_keep_mask(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Bool mask [B, V] of the nucleus: the smallest set of most likely tokens whose mass reaches top_p."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    keep_sorted = mass_before < top_p
    keep_sorted[:, 0] = True
    return torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)


def _sample_top_p(logp: torch.Tensor, top_p: float, generator: torch.Generator | None) -> torch.Tensor:
    probs = logp.exp()
    if top_p < 1.0:
        probs = probs.masked_fill(~top_p_keep_mask(probs, top_p), 0.0)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)
