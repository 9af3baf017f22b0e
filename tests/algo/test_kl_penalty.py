import math

import pytest
import torch

from seedfast.algo import losses


def _t(*values):
    return torch.tensor(values, dtype=torch.float64)


def test_k1_and_k2_by_hand():
    logprob, ref = _t(-1.0, -3.0), _t(-1.5, -2.0)
    torch.testing.assert_close(losses.kl_penalty(logprob, ref, "k1"), _t(0.5, -1.0))
    torch.testing.assert_close(losses.kl_penalty(logprob, ref, "k2"), _t(0.125, 0.5))


def test_low_var_kl_by_hand_and_its_clamp():
    # r = ℓref − ℓθ:  -0.5 -> e^-0.5 + 0.5 - 1;  4 -> e^4 - 5 = 49.6 -> 10;  -30 -> 29 -> 10;  80 -> 10
    logprob = _t(-1.0, -5.0, -0.5, -90.0).requires_grad_(True)
    ref = _t(-1.5, -1.0, -30.5, -10.0)
    kl = losses.kl_penalty(logprob, ref, "low_var_kl")
    torch.testing.assert_close(kl, _t(math.exp(-0.5) - 0.5, 10.0, 10.0, 10.0))
    kl.sum().backward()
    # d/dℓθ [e^r − r − 1] with r = ℓref − ℓθ is 1 − e^r; clamped tokens get no gradient (and no NaN)
    torch.testing.assert_close(logprob.grad, _t(1 - math.exp(-0.5), 0.0, 0.0, 0.0))


def test_k3_is_an_alias_and_default():
    g = torch.Generator().manual_seed(0)
    logprob, ref = -torch.rand(3, 4, generator=g), -torch.rand(3, 4, generator=g)
    torch.testing.assert_close(losses.kl_penalty(logprob, ref, "k3"), losses.kl_penalty(logprob, ref))


def test_kl_penalty_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"unknown kind='kl'.*'low_var_kl', 'k3', 'k1', 'k2'"):
        losses.kl_penalty(torch.zeros(2), torch.zeros(2), "kl")
    with pytest.raises(ValueError, match=r"ref_logprob has shape \(3,\) but logprob has shape \(2,\)"):
        losses.kl_penalty(torch.zeros(2), torch.zeros(3))


def test_low_var_kl_with_exp_overflow_in_fp32_has_finite_gradient():
    logprob = torch.tensor([-120.0, -1.0], requires_grad=True)  # r = 119: exp(r) is inf in fp32
    kl = losses.kl_penalty(logprob, torch.tensor([-1.0, -120.0]))
    kl.sum().backward()
    assert kl.tolist() == [10.0, 10.0]
    assert logprob.grad.tolist() == [0.0, 0.0]
