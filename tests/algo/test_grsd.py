import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seedfast.algo import grsd


def _t(*values):
    return torch.tensor(values, dtype=torch.float64)


def _hand_q_hat(advantages, deltas, eps=1e-6):
    """docs/algorithms.md, 'GRSD', for one group, plain Python: q̂ before the η cut and the clip."""
    q_exp = [math.expm1(max(-20.0, min(20.0, math.copysign(1.0, a) * d if a else 0.0)))
             for a, d in zip(advantages, deltas)]
    mean_abs = sum(abs(q) for q in q_exp) / len(q_exp)
    return [q / (mean_abs + eps) for q in q_exp]


def test_modulate_by_hand():
    # group 0 has contrast: A = [1, −1], δ = [0.5, 0.2] -> q = [0.5, −0.2]
    # q' = [0.6487, −0.1813], mean|q'| = 0.4150, q̂ = [1.5632, −0.4368]
    # group 1 has no contrast and keeps A, whatever its δ.
    adv, delta = _t(1.0, -1.0, 0.7, -0.3), _t(0.5, 0.2, 9.0, float("nan"))
    groups, contrast = [0, 0, 1, 1], torch.tensor([True, True, False, False])
    q1, q2 = _hand_q_hat([1.0, -1.0], [0.5, 0.2])
    assert (q1, q2) == (pytest.approx(1.56320, abs=1e-4), pytest.approx(-0.43680, abs=1e-4))

    out = grsd.modulate(adv, delta, groups, contrast)  # λ = 0.5, g_max = 0.2: both clipped
    torch.testing.assert_close(out, _t(1.1, -0.9, 0.7, -0.3))

    out = grsd.modulate(adv, delta, groups, contrast, lam=0.5, g_max=1.0)
    torch.testing.assert_close(out, _t(1.5, -(1 + 0.5 * q2), 0.7, -0.3))

    out = grsd.modulate(adv, delta, groups, contrast, lam=0.5, g_max=1.0, eta=0.5)  # |q̂2| ≤ η -> 0
    torch.testing.assert_close(out, _t(1.5, -1.0, 0.7, -0.3))

    out = grsd.modulate(adv, delta, groups, contrast, lam=5.0, g_max=1.0)  # 1 + 5·q̂2 < 0.1 -> floor
    torch.testing.assert_close(out, _t(6.0, -0.1, 0.7, -0.3))


def test_modulate_uses_its_own_group_mean():
    adv = _t(1.0, -1.0, 1.0, -1.0, 0.0)
    delta = _t(0.5, 0.2, 0.1, 0.3, 4.0)
    out = grsd.modulate(adv, delta, ["x", "x", "y", "y", "y"], torch.ones(5, dtype=torch.bool), g_max=10.0)
    for idx, (a, d) in (([0, 1], ([1.0, -1.0], [0.5, 0.2])), ([2, 3, 4], ([1.0, -1.0, 0.0], [0.1, 0.3, 4.0]))):
        q_hat = _hand_q_hat(a, d)
        expected = [ai * max(1 + 0.5 * q, 0.1) for ai, q in zip(a, q_hat)]
        torch.testing.assert_close(out[idx], _t(*expected))
    assert out[4].item() == 0.0  # A = 0 stays 0


@settings(max_examples=150, deadline=None)
@given(
    samples=st.lists(
        st.tuples(st.integers(0, 3), st.floats(-3, 3, allow_subnormal=False), st.floats(-30, 30)),
        min_size=1, max_size=24,
    ),
    contrast_groups=st.sets(st.integers(0, 3)),
    lam=st.floats(0, 20),
    g_max=st.floats(0, 5),
    eta=st.floats(0, 2),
)
def test_modulation_never_flips_a_sign_and_keeps_non_contrast_groups(samples, contrast_groups, lam, g_max, eta):
    groups = [g for g, _, _ in samples]
    adv = _t(*[a for _, a, _ in samples])
    delta = _t(*[d for _, _, d in samples])
    contrast = torch.tensor([g in contrast_groups for g in groups])
    out = grsd.modulate(adv, delta, groups, contrast, lam=lam, g_max=g_max, eta=eta)
    assert torch.isfinite(out).all()
    assert torch.equal(torch.sign(out), torch.sign(adv))
    nonzero = adv != 0
    multiplier = out[nonzero] / adv[nonzero]
    assert (multiplier >= 0.1 - 1e-12).all()
    assert (multiplier >= max(1 - lam * g_max, 0.1) - 1e-9).all()
    assert (multiplier <= 1 + lam * g_max + 1e-9).all()
    assert torch.equal(out[~contrast], adv[~contrast])


def test_has_contrast():
    success = torch.tensor([1, 0, 1, 1, 0, 0, 1])
    out = grsd.has_contrast(success, ["a", "a", "b", "b", "c", "c", "d"])
    assert out.tolist() == [True, True, False, False, False, False, False]


def test_turn_delta_by_hand():
    guide = _t([-1.0, -2.0, 0.0], [-1.0, -1.0, -1.0])
    old = _t([-1.5, -2.5, -9.0], [-3.0, -3.0, -3.0])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    delta = grsd.turn_delta(guide, old, mask)
    torch.testing.assert_close(delta, torch.tensor([0.5, 0.0]))


def test_reflection_advantages_by_hand():
    nan = float("nan")
    scores = _t(3.0, 1.0, nan, 2.0, 2.0, nan, 1.0, 1.0, 0.0)
    groups = ["a", "a", "a", "a", "b", "b", "c", "c", "d"]
    out = grsd.reflection_advantages(scores, groups, eps=0.0)
    # group a: valid 3, 1, 2 -> mean 2, population std sqrt((1 + 1 + 0) / 3) = sqrt(2/3) (the reference's
    # np.std), so ±1 / sqrt(2/3) = ±sqrt(3/2); b: one valid score; c: zero variance; d: alone
    r = 1.5 ** 0.5
    torch.testing.assert_close(out, _t(r, -r, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0))
    # group of 4 scores 0, 0, 3, 3: mean 1.5, population std 1.5 -> exactly ±1 (unbiased would give ±0.866)
    torch.testing.assert_close(grsd.reflection_advantages(_t(0.0, 0.0, 3.0, 3.0), [0] * 4, eps=0.0),
                               _t(-1.0, -1.0, 1.0, 1.0))


def test_grsd_rejects_bad_inputs():
    adv, delta = _t(1.0, -1.0, 0.5), _t(0.1, 0.2, 0.3)
    with pytest.raises(ValueError, match="contrast differs within the group of sample 0"):
        grsd.modulate(adv, delta, [0, 0, 1], torch.tensor([True, False, True]))
    with pytest.raises(ValueError, match=r"delta\[1\] = nan is not finite"):
        grsd.modulate(adv, _t(0.1, float("nan"), 0.3), [0, 0, 1], torch.tensor([True, True, False]))
    with pytest.raises(ValueError, match=r"delta has shape \(2,\) but advantages has shape \(3,\)"):
        grsd.modulate(adv, _t(0.1, 0.2), [0, 0, 1], torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="g_max must be >= 0"):
        grsd.modulate(adv, delta, [0, 0, 1], torch.ones(3, dtype=torch.bool), g_max=-0.1)
    with pytest.raises(ValueError, match=r"scores\[0\] = inf is infinite"):
        grsd.reflection_advantages(_t(float("inf"), 1.0), [0, 0])
    with pytest.raises(ValueError, match=r"mask has shape \(1, 3\) but guide_logprob has shape \(2, 3\)"):
        grsd.turn_delta(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(1, 3))


def test_contrast_groups_are_the_groups_with_a_win_and_a_loss():
    from seedfast.algo.grsd import contrast_groups

    won = [True, False, True, True, False, False, True]
    groups = [7, 7, 3, 3, 9, 9, 4]
    assert contrast_groups(won, groups) == {7}
    assert contrast_groups([], []) == set()
    with pytest.raises(ValueError, match="2 successes but 1 group ids"):
        contrast_groups([True, False], [1])
