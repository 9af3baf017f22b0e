import math

import pytest
import torch

from seedfast.algo import losses

# (advantage, log ratio ℓθ − ℓold, expected pg, clipped branch taken, dual clip taken, d pg / d ℓθ)
HAND_CASES = [
    (1.0, math.log(1.5), -1.2, True, False, 0.0),            # A > 0, ratio above 1 + ε: capped gain
    (1.0, math.log(0.5), -0.5, False, False, -0.5),          # A > 0, ratio below 1 − ε: unclipped (pessimistic)
    (1.0, math.log(1.1), -1.1, False, False, -1.1),          # inside the trust region
    (-1.0, math.log(0.5), 0.8, True, False, 0.0),            # A < 0, ratio below 1 − ε: clipped
    (-1.0, math.log(1.1), 1.1, False, False, 1.1),           # A < 0 inside the region
    (-1.0, math.log(5.0), 3.0, False, True, 0.0),            # A < 0, ratio 5: dual clip caps at −A·c = 3
    (-2.0, 30.0, 6.0, False, True, 0.0),                     # ratio e^30: still capped, no inf/NaN
    (2.0, 30.0, -2.4, True, False, 0.0),                     # A > 0, ratio e^30: clipped to −A(1+ε)
    (0.0, math.log(3.0), 0.0, False, False, 0.0),            # A = 0 contributes nothing
]


def _row(values):
    return torch.tensor([values], dtype=torch.float64)


def test_hand_cases_values_flags_and_gradients():
    adv = _row([c[0] for c in HAND_CASES])
    logprob = _row([c[1] - 2.0 for c in HAND_CASES]).requires_grad_(True)
    old = _row([-2.0] * len(HAND_CASES))
    mask = torch.ones_like(adv, dtype=torch.bool)
    terms = losses.policy_terms(logprob, old, adv)
    torch.testing.assert_close(terms.pg, _row([c[2] for c in HAND_CASES]))
    assert terms.clipped.tolist() == [[c[3] for c in HAND_CASES]]
    assert terms.dual_clipped.tolist() == [[c[4] for c in HAND_CASES]]

    n = len(HAND_CASES)
    loss, metrics = losses.policy_loss(logprob, old, adv, mask)
    assert loss.item() == pytest.approx(sum(c[2] for c in HAND_CASES) / n)
    loss.backward()
    torch.testing.assert_close(logprob.grad, _row([c[5] / n for c in HAND_CASES]))
    assert metrics["clip_frac"].item() == pytest.approx(3 / n)
    assert metrics["dual_clip_frac"].item() == pytest.approx(2 / n)
    assert metrics["ratio_min"].item() == pytest.approx(0.5)
    assert metrics["ratio_max"].item() == pytest.approx(math.exp(20.0))  # log ratio clamped at 20
    assert all(not m.requires_grad and m.dim() == 0 for m in metrics.values())


def test_dual_clip_off_lets_a_negative_advantage_grow_with_the_ratio():
    logprob = _row([math.log(5.0)]).requires_grad_(True)
    loss, metrics = losses.policy_loss(logprob, _row([0.0]), torch.tensor([-1.0], dtype=torch.float64),
                                       torch.ones(1, 1), dual_clip=None)
    loss.backward()
    assert loss.item() == pytest.approx(5.0)
    assert logprob.grad.item() == pytest.approx(5.0)  # d(−A·ρ)/dℓθ = −A·ρ
    assert metrics["dual_clip_frac"].item() == 0.0


def test_asymmetric_clip_high():
    args = (_row([math.log(1.25)]), _row([0.0]), _row([1.0]), torch.ones(1, 1))
    assert losses.policy_loss(*args, clip_high=0.28)[0].item() == pytest.approx(-1.25)
    assert losses.policy_loss(*args, clip_high=0.2)[0].item() == pytest.approx(-1.2)
    low = (_row([math.log(0.75)]), _row([0.0]), _row([-1.0]), torch.ones(1, 1))
    assert losses.policy_loss(*low, clip_low=0.1)[0].item() == pytest.approx(0.9)


def _scalar_pg(a, log_ratio, eps_low, eps_high, c):
    """docs/algorithms.md, 'Policy loss', one token, plain Python."""
    rho = math.exp(log_ratio)
    pg = max(-a * rho, -a * min(max(rho, 1 - eps_low), 1 + eps_high))
    if c is not None and a < 0:
        pg = min(pg, -a * c)
    return pg


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("dual_clip", [3.0, 1.5, None])
def test_random_batch_matches_scalar_reference(agg, dual_clip):
    g = torch.Generator().manual_seed(0)
    b, t = 6, 9
    logprob = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    old = logprob + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.8
    adv = torch.randn(b, generator=g, dtype=torch.float64)
    mask = torch.rand(b, t, generator=g) < 0.7
    loss, _ = losses.policy_loss(logprob, old, adv, mask, 0.2, 0.25, dual_clip, agg=agg)

    valid = mask.tolist()
    rows = []
    for i in range(b):
        pgs = [_scalar_pg(adv[i].item(), (logprob[i, j] - old[i, j]).item(), 0.2, 0.25, dual_clip)
               for j in range(t) if valid[i][j]]
        rows.append(pgs)
    nonempty = [r for r in rows if r]
    if agg == "token-mean":
        expected = sum(map(sum, rows)) / sum(map(len, rows))
    elif agg == "seq-mean-token-mean":
        expected = sum(sum(r) / len(r) for r in nonempty) / len(nonempty)
    else:
        expected = sum(sum(r) for r in nonempty) / len(nonempty)
    assert loss.item() == pytest.approx(expected, rel=1e-12)


def test_per_sample_and_per_token_advantages_agree():
    g = torch.Generator().manual_seed(1)
    logprob, old = -torch.rand(3, 5, generator=g), -torch.rand(3, 5, generator=g)
    adv = torch.tensor([1.0, -0.5, 2.0])
    mask = torch.ones(3, 5)
    a, ma = losses.policy_loss(logprob, old, adv, mask)
    b, mb = losses.policy_loss(logprob, old, adv[:, None].expand(3, 5), mask)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(ma["clip_frac"], mb["clip_frac"])


def test_padding_with_inf_and_nan_does_not_leak():
    logprob = torch.tensor([[-1.0, -0.5, float("nan")], [-2.0, float("-inf"), float("-inf")]], requires_grad=True)
    old = torch.tensor([[-1.1, -0.4, float("-inf")], [-2.2, float("nan"), 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, metrics = losses.policy_loss(logprob, old, torch.tensor([1.0, -1.0]), mask)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(logprob.grad).all()
    assert (logprob.grad[~mask.bool()] == 0).all()
    assert all(torch.isfinite(v) for v in metrics.values())


def test_approx_kl_is_the_k3_estimate_over_valid_tokens():
    log_ratio = torch.tensor([[0.3, -0.2, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]])
    _, metrics = losses.policy_loss(log_ratio, torch.zeros_like(log_ratio), torch.ones(1), mask)
    expected = sum(math.exp(r) - 1 - r for r in (0.3, -0.2)) / 2
    assert metrics["approx_kl"].item() == pytest.approx(expected, rel=1e-12)
    assert metrics["ratio_mean"].item() == pytest.approx((math.exp(0.3) + math.exp(-0.2)) / 2, rel=1e-12)


def test_no_valid_token_gives_zero_loss_and_neutral_metrics():
    logprob = torch.randn(2, 3, requires_grad=True)
    loss, metrics = losses.policy_loss(logprob, torch.randn(2, 3), torch.ones(2), torch.zeros(2, 3))
    loss.backward()
    assert loss.item() == 0.0 and (logprob.grad == 0).all()
    assert metrics["ratio_min"].item() == 1.0 and metrics["ratio_max"].item() == 1.0
    assert metrics["clip_frac"].item() == 0.0


def test_bf16_inputs_are_computed_in_fp32():
    g = torch.Generator().manual_seed(2)
    logprob, old = -torch.rand(4, 6, generator=g), -torch.rand(4, 6, generator=g)
    adv, mask = torch.randn(4, generator=g), torch.ones(4, 6)
    loss, _ = losses.policy_loss(logprob.bfloat16(), old.bfloat16(), adv.bfloat16(), mask)
    ref, _ = losses.policy_loss(logprob.bfloat16().float(), old.bfloat16().float(), adv.bfloat16().float(), mask)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref)


def test_policy_loss_rejects_bad_arguments():
    x, m = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"old_logprob has shape \(2, 4\) but logprob has shape \(2, 3\)"):
        losses.policy_loss(x, torch.zeros(2, 4), torch.zeros(2), m)
    with pytest.raises(ValueError, match=r"advantages has shape \(3,\); expected \(2,\) or \(2, 3\)"):
        losses.policy_loss(x, x, torch.zeros(3), m)
    with pytest.raises(ValueError, match=r"mask has shape \(3, 2\) but logprob"):
        losses.policy_loss(x, x, torch.zeros(2), torch.ones(3, 2))
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        losses.policy_loss(x, x, torch.zeros(2), m, dual_clip=0.5)
    with pytest.raises(ValueError, match="clip_low must be in"):
        losses.policy_loss(x, x, torch.zeros(2), m, clip_low=1.0)
    with pytest.raises(ValueError, match=r"unknown agg='sum'"):
        losses.policy_loss(x, x, torch.zeros(2), m, agg="sum")
    with pytest.raises(TypeError, match="logprob must be a floating-point tensor"):
        losses.policy_loss(torch.zeros(2, 3, dtype=torch.long), x, torch.zeros(2), m)
    with pytest.raises(ValueError, match=r"logprob must be \[B, T\]"):
        losses.policy_loss(torch.zeros(6), torch.zeros(6), torch.zeros(6), torch.ones(6))
