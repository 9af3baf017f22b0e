"""token_loss (the torch backend's per-token loss and its a = ∂L/∂ℓθ, b = ∂L/∂H) on hand-computed values."""

import math

import pytest
import torch

from seedfast.ops import LossOptions
from seedfast.ops.token_loss import merge_metric_sums, metric_means, needs_entropy, token_loss

OPTIONS = dict(clip_low=0.2, clip_high=0.2, kl_coef=0.1, kl_kind="k1", entropy_coef=0.01, opd_coef=0.2,
               opd_beta=2.0, gate="gap")


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def inputs():
    nan = float("nan")
    # token 0: A > 0, ratio e^0.1 inside the clip range, teacher gap Δ = 1.5 (gate σ(3) ≈ 0.9526)
    # token 1: A < 0, ratio e^1.5, dual clip caps pg at −A·3 = 3 (constant); teacher masked out
    # token 2: A > 0, ratio e^0.5 clipped to 1.2 (constant); Δ = −1 (gate σ(−2))
    # token 3: weight 0 and NaN everywhere: contributes nothing
    return dict(
        logprob=torch.tensor([-2.0, -1.0, -0.5, nan]),
        entropy=torch.tensor([1.0, 2.0, 0.5, nan]),
        old_logprob=torch.tensor([-2.1, -2.5, -1.0, nan]),
        ref_logprob=torch.tensor([-2.5, -1.0, -0.5, nan]),
        teacher_logprob=torch.tensor([-0.5, 0.0, -1.5, nan]),
        teacher_mask=torch.tensor([True, False, True, True]),
        advantages=torch.tensor([2.0, -1.0, 1.0, nan]),
        token_weights=torch.tensor([0.5, 0.25, 0.25, 0.0]),
    )


@pytest.mark.parametrize("dual_clip", [3.0, None])
def test_hand_computed_loss_and_derivatives(dual_clip):
    loss, a, b, sums = token_loss(**inputs(), options=LossOptions(dual_clip=dual_clip, **OPTIONS))
    w = [0.5, 0.25, 0.25]
    g0, g2 = sigmoid(2.0 * 1.5), sigmoid(2.0 * -1.0)
    assert g0 == pytest.approx(0.9525741, abs=1e-7)  # sigmoid(3), by hand
    rho0, rho1 = math.exp(0.1), math.exp(1.5)
    pg1 = 3.0 if dual_clip else rho1
    expected_loss = (w[0] * (-2.0 * rho0 + 0.1 * 0.5 - 0.01 * 1.0) + 0.2 * w[0] * g0 * 1.5
                     + w[1] * (pg1 + 0.1 * 0.0 - 0.01 * 2.0)
                     + w[2] * (-1.2 + 0.1 * 0.0 - 0.01 * 0.5) + 0.2 * w[2] * g2 * -1.0)
    expected_a = [w[0] * (-2.0 * rho0 + 0.1) - 0.2 * w[0] * g0,
                  w[1] * ((0.0 if dual_clip else rho1) + 0.1),
                  w[2] * 0.1 - 0.2 * w[2] * g2,
                  0.0]
    assert loss.item() == pytest.approx(expected_loss, rel=1e-6)
    torch.testing.assert_close(a, torch.tensor(expected_a), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(b, torch.tensor([-0.01 * x for x in w] + [0.0]), rtol=1e-6, atol=1e-9)

    assert sums["weight"].item() == pytest.approx(1.0)
    assert sums["clip_frac"].item() == pytest.approx(0.25)  # token 2
    assert sums["ratio_min"].item() == pytest.approx(rho0, rel=1e-6)
    assert sums["ratio_max"].item() == pytest.approx(rho1, rel=1e-6)
    assert sums["teacher_weight"].item() == pytest.approx(0.75)
    assert sums["gate"].item() == pytest.approx(0.5 * g0 + 0.25 * g2, rel=1e-6)
    means = metric_means(sums)
    assert means["gate_mean"].item() == pytest.approx((0.5 * g0 + 0.25 * g2) / 0.75, rel=1e-6)
    assert means["kl"].item() == pytest.approx(0.5 * 0.5, rel=1e-6)


def test_b_is_none_when_the_loss_ignores_entropy():
    kwargs = {**OPTIONS, "entropy_coef": 0.0, "gate": "entropy"}  # the gate is stop-gradient
    _, _, b, sums = token_loss(**inputs(), options=LossOptions(dual_clip=3.0, **kwargs))
    assert b is None and "entropy" in sums
    _, _, b, sums = token_loss(**{**inputs(), "entropy": None},
                               options=LossOptions(dual_clip=3.0, **{**OPTIONS, "entropy_coef": 0.0}))
    assert b is None and "entropy" not in sums


def test_needs_entropy():
    def needs(entropy_coef, opd_coef, gate):
        return needs_entropy(LossOptions(entropy_coef=entropy_coef, opd_coef=opd_coef, gate=gate))

    assert not needs(0.0, 0.0, "soft_or")
    assert not needs(0.0, 0.1, "gap")
    assert needs(0.0, 0.1, "entropy") and needs(0.0, 0.1, "soft_or")
    assert needs(0.001, 0.0, "gap")


def test_metric_sums_merge_like_one_pass():
    data = inputs()
    options = LossOptions(dual_clip=3.0, **OPTIONS)
    whole = token_loss(**data, options=options)[3]
    parts = [token_loss(**{k: v[s] for k, v in data.items()}, options=options)[3]
             for s in (slice(0, 1), slice(1, 4))]
    merged = merge_metric_sums(merge_metric_sums({}, parts[0]), parts[1])
    assert merged.keys() == whole.keys()
    for key in whole:
        torch.testing.assert_close(merged[key], whole[key])


def test_soft_or_gate_with_entropy_in_nats_by_hand():
    # H = 2 nats, Δ = 0, 0.5, 1, 2, β = 5: g = σ(5·(1 − e^−2 · e^−Δ)) (tests/algo/test_opd_loss.py). On-policy
    # with A = 0 and only the OPD term, a = ∂L/∂ℓθ = −g per token of weight 1 (the gate takes no gradient).
    want = torch.tensor([0.9869176626015187, 0.9899449566414819, 0.9914315636104873, 0.9926699930069641])
    lp = torch.full((4,), -3.0)
    _, a, _, sums = token_loss(lp, torch.full((4,), 2.0), None, None, lp + torch.tensor([0.0, 0.5, 1.0, 2.0]),
                               None, torch.zeros(4), torch.ones(4),
                               options=LossOptions(clip_low=0.2, clip_high=0.2, dual_clip=None, kl_coef=0.0,
                                                   kl_kind="k1", entropy_coef=0.0, opd_coef=1.0, opd_beta=5.0,
                                                   gate="soft_or"))
    torch.testing.assert_close(-a, want)
    torch.testing.assert_close(sums["gate"], want.sum())

