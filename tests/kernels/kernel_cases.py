"""Adversarial inputs of the fused-row kernel tests (test_triton_single_pass.py, test_triton_two_contexts.py,
test_triton_ignored_nan.py): odd V over several interpreter tiles, all-negative logits, logits beyond ±3e3, ignored
targets; and the loss options they run under."""

import torch

N, D, V = 45, 32, 64 * 3 + 11  # V: 3 interpreter vocabulary tiles and a ragged one
# every term of the loss on, with a dual clip: the options the fused-row kernels are checked under
OPTIONS = dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0, kl_coef=0.1, kl_kind="low_var_kl", entropy_coef=0.03,
               opd_coef=0.5, opd_beta=5.0, gate="gap")


def random_case(dtype, seed=0, n=N, vocab=V):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, D, generator=g).to(dtype)
    weight = (torch.randn(vocab, D, generator=g) / D**0.5 * 3).to(dtype)
    targets = torch.randint(0, vocab, (n,), generator=g)
    targets[[i for i in (3, 17, 40) if i < n]] = -100
    return hidden, weight, targets


def all_negative_case(seed=2):
    # Every logit in [-1100, -1000]: a running max started at 0 would underflow every exp.
    g = torch.Generator().manual_seed(seed)
    hidden = torch.ones(N, D)
    level = -1000.0 - 100.0 * torch.rand(V, generator=g)
    weight = level[:, None] / D + 0.01 * torch.randn(V, D, generator=g)
    return hidden, weight, torch.randint(0, V, (N,), generator=g)


def huge_case(seed=6):
    # Exact integer logits beyond ±3e3 with a clear winner per row: p is one-hot up to exp(-20) and
    # p·(log p + H) must come out 0, not NaN.
    g = torch.Generator().manual_seed(seed)
    sign = torch.randint(0, 2, (D,), generator=g) * 2 - 1
    levels = torch.randperm(V, generator=g)[:, None] - V // 2
    weight = (levels * sign).float()
    hidden = ((torch.randint(0, 2, (N, 1), generator=g) * 2 - 1) * sign).float()
    assert float((hidden.double() @ weight.double().T).abs().max()) > 3e3
    targets = torch.randint(0, V, (N,), generator=g)
    targets[5] = -100
    return hidden, weight, targets
