"""Independent references for the ops tests: fp64 materialized logits, and the loss composed from
linear-logprob outputs with seedfast.algo.losses (the reference math)."""

from __future__ import annotations

import torch


def fp64_leaves(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    return [None if t is None else t.detach().double().requires_grad_() for t in tensors]


def materialized_logprob(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         temperature: float = 1.0, ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprob, entropy) [N] in the dtype of the inputs (use fp64), via full log_softmax; 0 on ignored rows."""
    logits = hidden @ weight.t() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    ignored = targets == ignore_index
    picked = logp.gather(1, targets.clamp(0, weight.shape[0] - 1).unsqueeze(1)).squeeze(1)
    entropy = -(logp.exp() * logp).sum(-1)
    zero = torch.zeros((), dtype=logp.dtype)
    return torch.where(ignored, zero, picked), torch.where(ignored, zero, entropy)


def random_problem(n: int, d: int, vocab: int, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                   scale: float = 1.0, ignored: int = 0, ignore_index: int = -100):
    """hidden [n, d] and weight [vocab, d] (leaves requiring grad) with logits of order `scale`, targets [n]."""
    gen = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(n, d, generator=gen) * scale / d ** 0.5).to(dtype).requires_grad_()
    weight = torch.randn(vocab, d, generator=gen).to(dtype).requires_grad_()
    targets = torch.randint(0, vocab, (n,), generator=gen)
    if ignored:
        targets[torch.randperm(n, generator=gen)[:ignored]] = ignore_index
    return hidden, weight, targets


def max_rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual − expected| / max |expected| (a scale-aware error for gradients)."""
    expected = expected.double()
    return float((actual.double() - expected).abs().max() / expected.abs().max().clamp_min(1e-30))
