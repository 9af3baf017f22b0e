import math

import pytest
import torch

from seedfast.algo import losses


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _t(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_gap_gate_worked_example_of_the_spec():
    # Δ = ℓskill − ℓθ = 1.5, β = 2 -> σ(3) ≈ 0.9526
    g = losses.gate(_t(-2.0), _t(-0.5), beta=2.0, kind="gap")
    assert g.item() == pytest.approx(0.9525741268, abs=1e-9)


def test_entropy_and_soft_or_gates_by_hand():
    logprob, teacher, entropy = _t(-1.0, -2.0), _t(-0.5, -3.0), _t(0.3, 0.2)  # Δ = 0.5, -1.0
    g_entropy = losses.gate(logprob, teacher, beta=5.0, kind="entropy", entropy=entropy)
    torch.testing.assert_close(g_entropy, _t(_sigmoid(1.5), _sigmoid(1.0)))
    # soft_or: σ(β·[1 − (1 − Ĥ)(1 − Δ̂)]), Ĥ = 1 − e^−H, Δ̂ = 1 − e^−max(Δ, 0):
    #   token 0: 1 − e^−0.3 · e^−0.5 = 1 − e^−0.8 = 0.550671;  token 1 (Δ < 0, Δ̂ = 0): 1 − e^−0.2 = 0.181269
    g_soft_or = losses.gate(logprob, teacher, beta=2.0, kind="soft_or", entropy=entropy)
    torch.testing.assert_close(g_soft_or, _t(_sigmoid(2 * 0.5506710358827784), _sigmoid(2 * 0.18126924692201818)))


# H = 2 nats, Δ = 0, 0.5, 1, 2, β = 5: σ(5·(1 − e^−2 · e^−Δ)), by hand. The raw product σ(5·[1 − (1 − H)(1 − Δ)])
# fell from 1.00 to σ(0) = 0.50 over the same Δ: not an OR for inputs outside [0, 1].
SOFT_OR_H2 = ((0.0, 0.9869176626015187), (0.5, 0.9899449566414819), (1.0, 0.9914315636104873),
              (2.0, 0.9926699930069641))


def test_soft_or_gate_with_entropy_in_nats_never_falls_as_the_gap_grows():
    delta = _t(*(d for d, _ in SOFT_OR_H2))
    g = losses.gate(torch.zeros_like(delta), delta, beta=5.0, kind="soft_or", entropy=torch.full_like(delta, 2.0))
    torch.testing.assert_close(g, _t(*(v for _, v in SOFT_OR_H2)), rtol=0, atol=1e-12)
    assert bool((g.diff() > 0).all())


def test_soft_or_gate_is_monotone_in_each_input_and_between_the_inputs_own_gates():
    h = torch.linspace(0.0, 8.0, 17, dtype=torch.float64)[:, None].expand(17, 23)
    delta = torch.linspace(-4.0, 7.0, 23, dtype=torch.float64)[None, :].expand(17, 23)
    g = losses.gate(torch.zeros_like(delta), delta, beta=5.0, kind="soft_or", entropy=h)
    assert bool((g.diff(dim=0) >= 0).all()) and bool((g.diff(dim=1) >= 0).all())
    # Δ ≤ 0 adds nothing to the OR (Δ̂ = 0); both inputs 0 gives σ(0); the OR stays below σ(β)
    torch.testing.assert_close(g[:, delta[0] <= 0], g[:, delta[0] <= 0][:, :1].expand_as(g[:, delta[0] <= 0]))
    assert g[0, 0].item() == 0.5 and bool((g < _sigmoid(5.0)).all())


@pytest.mark.parametrize("gate", ["gap", "entropy", "soft_or"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_gradient_reaches_only_the_student_logprob(gate, agg):
    gen = torch.Generator().manual_seed(0)
    logprob = (-torch.rand(3, 5, generator=gen, dtype=torch.float64) * 4).requires_grad_(True)
    teacher = (-torch.rand(3, 5, generator=gen, dtype=torch.float64) * 4).requires_grad_(True)
    entropy = (torch.rand(3, 5, generator=gen, dtype=torch.float64) * 2).requires_grad_(True)
    mask = torch.rand(3, 5, generator=gen) < 0.8
    loss, _ = losses.opd_loss(logprob, teacher, mask, beta=5.0, gate=gate, entropy=entropy, agg=agg)
    loss.backward()
    assert teacher.grad is None
    assert entropy.grad is None
    g = losses.gate(logprob, teacher, 5.0, gate, entropy)
    weights = losses.aggregation_weights(mask, agg, dtype=torch.float64)
    torch.testing.assert_close(logprob.grad, -mask.double() * g * weights)  # d opd_t / d ℓθ_t = −m_t · g_t


def test_opd_loss_value_and_metrics_by_hand():
    logprob = _t([-2.0, -1.0, -4.0])
    teacher = _t([-0.5, -1.5, 0.0])
    mask = torch.tensor([[1, 1, 0]])
    loss, metrics = losses.opd_loss(logprob, teacher, mask, beta=2.0)
    g1, g2 = _sigmoid(3.0), _sigmoid(-1.0)
    assert loss.item() == pytest.approx((g1 * 1.5 + g2 * -0.5) / 2)
    assert metrics["gate_mean"].item() == pytest.approx((g1 + g2) / 2)
    assert metrics["gap_mean"].item() == pytest.approx((1.5 - 0.5) / 2)
    assert metrics["opd_term"].item() == pytest.approx((g1 * 1.5 + g2 * -0.5) / 2)
    assert metrics["teacher_valid_frac"].item() == 1.0


def test_teacher_mask_zeroes_a_sample_but_keeps_the_response_token_count():
    logprob = _t([-2.0, -1.0], [-1.0, -1.0]).requires_grad_(True)
    teacher = _t([-0.5, -1.5], [float("nan"), float("nan")])  # sample 1: skill failed to parse
    mask = torch.ones(2, 2, dtype=torch.bool)
    loss, metrics = losses.opd_loss(logprob, teacher, mask, beta=2.0, teacher_mask=torch.tensor([True, False]))
    loss.backward()
    g1, g2 = _sigmoid(3.0), _sigmoid(-1.0)
    assert loss.item() == pytest.approx((g1 * 1.5 + g2 * -0.5) / 4)
    torch.testing.assert_close(logprob.grad, _t([-g1 / 4, -g2 / 4], [0.0, 0.0]))
    assert metrics["teacher_valid_frac"].item() == 0.5
    assert metrics["gate_mean"].item() == pytest.approx((g1 + g2) / 2)
    # per-token teacher mask, and the product passed as the mask (counts teacher-valid tokens only)
    tmask = torch.tensor([[True, True], [False, False]])
    per_token, _ = losses.opd_loss(logprob, teacher, mask, beta=2.0, teacher_mask=tmask)
    product, _ = losses.opd_loss(logprob, teacher, tmask, beta=2.0)
    assert per_token.item() == pytest.approx(loss.item())
    assert product.item() == pytest.approx(2 * loss.item())


def test_opd_loss_rejects_bad_arguments():
    x, m = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"unknown gate='max'.*'gap', 'entropy', 'soft_or'"):
        losses.opd_loss(x, x, m, gate="max")
    with pytest.raises(ValueError, match=r"gate='entropy' needs entropy"):
        losses.opd_loss(x, x, m, gate="entropy")
    with pytest.raises(ValueError, match=r"kind='soft_or' needs entropy"):
        losses.gate(x, x, kind="soft_or")
    with pytest.raises(ValueError, match=r"teacher_logprob has shape \(2, 2\) but logprob has shape \(2, 3\)"):
        losses.opd_loss(x, torch.zeros(2, 2), m)
    with pytest.raises(ValueError, match=r"entropy has shape \(3,\) but logprob"):
        losses.opd_loss(x, x, m, gate="entropy", entropy=torch.zeros(3))
    with pytest.raises(ValueError, match=r"teacher_mask has shape \(3,\); expected \(2,\) or \(2, 3\)"):
        losses.opd_loss(x, x, m, teacher_mask=torch.ones(3, dtype=torch.bool))


def test_the_advantage_form_shifts_the_advantage_by_hand_computed_amounts():
    """A = 0.5, ℓθ = ℓold = −1 (ρ = 1): the teacher at −0.2 (Δ = +0.8) and −6 (Δ = −5, clipped to −3) with λ = 0.5
    shifts the advantages to 0.9 and −1.0; a third token whose skill failed keeps 0.5. On-policy pg = −A·ρ, so the
    token-mean loss is −(0.9 − 1.0 + 0.5)/3 and ∂L/∂ℓθ = −A'/3 per token."""
    logprob = torch.full((1, 3), -1.0, dtype=torch.float64, requires_grad=True)
    old = torch.full((1, 3), -1.0, dtype=torch.float64)
    teacher = torch.tensor([[-0.2, -6.0, 5.0]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    options = losses.LossOptions(opd_coef=0.5, opd_mode="advantage", opd_adv_clip=3.0)
    loss, metrics = losses.total_loss(logprob, old, torch.tensor([0.5], dtype=torch.float64), mask,
                                      teacher_logprob=teacher, teacher_mask=torch.tensor([[True, True, False]]),
                                      options=options)
    assert float(loss) == pytest.approx(-(0.9 - 1.0 + 0.5) / 3)
    (grad,) = torch.autograd.grad(loss, logprob)
    torch.testing.assert_close(grad, torch.tensor([[-0.9, 1.0, -0.5]], dtype=torch.float64) / 3)
    assert float(metrics["opd_term"]) == pytest.approx((0.4 - 1.5) / 2)
    assert "gate_mean" not in metrics
