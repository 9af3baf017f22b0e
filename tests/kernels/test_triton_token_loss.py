"""Fused token-loss kernel (interpreter on CPU) against the formulas of docs/algorithms.md in fp64 and the torch
backend."""

import math

import pytest
import torch

from seedfast.ops import LossOptions, chunked
from seedfast.ops import triton_backend as tb
from tests.kernels.triton_reference import INTERPRETER, assert_close, reference_token_loss

pytestmark = INTERPRETER

N = 75
OPTIONS = dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0, kl_coef=0.1, kl_kind="low_var_kl", entropy_coef=0.01,
               opd_coef=0.5, opd_beta=5.0, gate="gap")


def _per_token(seed=0, n=N):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(n, generator=g) * 4
    per_token = dict(
        logprob=lp,
        entropy=torch.rand(n, generator=g) * 3,
        old_logprob=lp + torch.randn(n, generator=g) * 0.4,
        ref_logprob=lp + torch.randn(n, generator=g) * 2,  # some k3 values beyond the clamp at 10
        teacher_logprob=lp + torch.randn(n, generator=g),
        teacher_mask=torch.rand(n, generator=g) > 0.3,
        advantages=torch.randn(n, generator=g),
        token_weights=torch.rand(n, generator=g) / n,
    )
    per_token["token_weights"][::6] = 0.0  # padding, holding garbage that must not leak
    for key in ("logprob", "old_logprob", "ref_logprob", "teacher_logprob", "entropy"):
        per_token[key][::12] = float("nan")
    per_token["logprob"][6] = float("inf")
    per_token["old_logprob"][1] = per_token["logprob"][1] - 30  # log-ratio beyond the ±20 clamp
    return per_token


def _compare(got, want):
    loss, a, b, sums = got
    ref_loss, ref_a, ref_b, ref_sums = want
    assert_close(loss, ref_loss, 1e-5, "loss")
    assert_close(a, ref_a, 1e-5, "a")
    assert (b is None) == (ref_b is None)
    if b is not None:
        assert_close(b, ref_b, 1e-5, "b")
    assert set(sums) == set(ref_sums)
    for key, value in sums.items():
        assert value.dim() == 0 and value.dtype == torch.float32
        assert_close(value, ref_sums[key], 1e-5, key)


@pytest.mark.parametrize("gate", ["gap", "entropy", "soft_or"])
@pytest.mark.parametrize("kl_kind", ["k1", "k2", "low_var_kl"])
def test_matches_spec_formulas(gate, kl_kind):
    per_token = _per_token()
    options = {**OPTIONS, "gate": gate, "kl_kind": kl_kind}
    got = tb.token_loss(*per_token.values(), options=LossOptions(**options))
    assert bool(torch.isfinite(got[1]).all())
    _compare(got, reference_token_loss(*per_token.values(), **options))


def test_minimal_terms_no_dual_clip():
    per_token = _per_token(seed=1)
    for key in ("entropy", "ref_logprob", "teacher_logprob", "teacher_mask"):
        per_token[key] = None
    options = {**OPTIONS, "dual_clip": None, "kl_coef": 0.0, "entropy_coef": 0.0, "opd_coef": 0.0}
    got = tb.token_loss(*per_token.values(), options=LossOptions(**options))
    assert got[2] is None and set(got[3]) == {"weight", "clip_frac", "ratio_min", "ratio_max"}
    _compare(got, reference_token_loss(*per_token.values(), **options))


def test_hand_computed_cases():
    # token 0: OPD only (A = 0, on-policy), Δ = 1.5, β = 2 -> g = σ(3) = 0.952574, a = -λ·g
    # token 1: A = -1, ρ = e² -> unclipped 7.389 capped by the dual clip at -A·c = 3, a = 0
    # token 2: A = 1, ρ = e^0.5 -> clipped at 1 + 0.2: pg = -1.2, a = 0, counted in clip_frac
    # token 3: A = 1, ρ = 1.1 inside the band: pg = -1.1, a = -1.1; k3 with r = 5: e^5 - 6 > 10 -> 10, no grad
    lp = torch.tensor([-2.0, -1.0, -1.0, -1.0])
    old = lp - torch.tensor([0.0, 2.0, 0.5, math.log(1.1)])
    ref = torch.tensor([-2.0, -1.0, -1.0, 4.0])
    teacher = torch.tensor([-0.5, -1.0, -1.0, -1.0])
    tmask = torch.tensor([True, False, False, False])
    adv = torch.tensor([0.0, -1.0, 1.0, 1.0])
    w = torch.ones(4)
    loss, a, b, sums = tb.token_loss(lp, None, old, ref, teacher, tmask, adv, w, options=LossOptions(
        clip_low=0.2, clip_high=0.2, dual_clip=3.0, kl_coef=1.0, kl_kind="low_var_kl", entropy_coef=0.0, opd_coef=1.0,
        opd_beta=2.0, gate="gap"))
    g = 1 / (1 + math.exp(-3))
    assert abs(float(sums["gate"]) - g) < 1e-6 and abs(g - 0.952574) < 1e-6
    assert torch.allclose(a, torch.tensor([-g, 0.0, 0.0, -1.1]), atol=1e-6)
    assert abs(float(loss) - (g * 1.5 + 3.0 - 1.2 - 1.1 + 10.0)) < 1e-5
    assert float(sums["clip_frac"]) == 1.0 and float(sums["kl"]) == pytest.approx(10.0)
    assert float(sums["ratio_max"]) == pytest.approx(math.exp(2), rel=1e-6) and b is None


def test_soft_or_gate_with_entropy_in_nats_by_hand():
    # H = 2 nats, Δ = 0, 0.5, 1, 2, β = 5: g = σ(5·(1 − e^−2 · e^−Δ)) (tests/algo/test_opd_loss.py); on-policy,
    # A = 0 and only the OPD term: a = −g per token of weight 1
    want = torch.tensor([0.9869176626015187, 0.9899449566414819, 0.9914315636104873, 0.9926699930069641])
    lp = torch.full((4,), -3.0)
    _, a, _, sums = tb.token_loss(lp, torch.full((4,), 2.0), None, None, lp + torch.tensor([0.0, 0.5, 1.0, 2.0]),
                                  None, torch.zeros(4), torch.ones(4),
                                  options=LossOptions(dual_clip=None, opd_coef=1.0, opd_beta=5.0, gate="soft_or"))
    assert_close(-a, want, 1e-6, "gate")
    assert_close(sums["gate"], want.sum(), 1e-6, "gate sum")


@pytest.mark.parametrize("n_programs", [1, 2, 7])
def test_program_count_does_not_change_results(n_programs):
    per_token = _per_token(seed=2)
    got = tb.token_loss(*per_token.values(), options=LossOptions(**OPTIONS), block=16, n_programs=n_programs)
    _compare(got, reference_token_loss(*per_token.values(), **OPTIONS))


@pytest.mark.parametrize("gate", ["gap", "soft_or"])
def test_matches_torch_backend(gate):
    per_token = _per_token(seed=3)
    options = LossOptions(**{**OPTIONS, "gate": gate, "kl_kind": "k2"})
    _compare(tb.token_loss(*per_token.values(), options=options),
             tuple(x.double() if isinstance(x, torch.Tensor) else x for x in chunked.token_loss(
                 *per_token.values(), options=options)[:3]) + (
                 {k: v.double() for k, v in chunked.token_loss(*per_token.values(), options=options)[3].items()},))


def test_zero_tokens():
    per_token = {k: v[:0] for k, v in _per_token().items()}
    loss, a, b, sums = tb.token_loss(*per_token.values(), options=LossOptions(**OPTIONS))
    assert float(loss) == 0.0 and a.shape == b.shape == (0,)
    assert float(sums["ratio_min"]) == math.inf and float(sums["weight"]) == 0.0


def test_bad_options_raise_one_clear_error():
    per_token = _per_token()
    options = LossOptions(**OPTIONS)
    with pytest.raises(ValueError, match="kl_kind"):
        tb.token_loss(*per_token.values(), options=LossOptions(**{**OPTIONS, "kl_kind": "k9"}))
    with pytest.raises(ValueError, match="gate"):
        tb.token_loss(*per_token.values(), options=LossOptions(**{**OPTIONS, "gate": "max"}))
    with pytest.raises(ValueError, match="ref_logprob"):
        tb.token_loss(*{**per_token, "ref_logprob": None}.values(), options=options)
    with pytest.raises(ValueError, match="entropy"):
        tb.token_loss(*{**per_token, "entropy": None}.values(), options=options)
    with pytest.raises(ValueError, match="advantages"):
        tb.token_loss(*{**per_token, "advantages": per_token["advantages"][:-1]}.values(), options=options)
    with pytest.raises(ValueError, match="dual_clip"):
        tb.token_loss(*per_token.values(), options=LossOptions(**{**OPTIONS, "dual_clip": 0.5}))


def _torch_reference(per_token, options):
    loss, a, b, sums = chunked.token_loss(*per_token.values(), options=options)
    return (loss.double(), a.double(), None if b is None else b.double(), {k: v.double() for k, v in sums.items()})


@pytest.mark.parametrize("opd_mode", ["gate", "advantage", "reverse_kl", "jsd"])
@pytest.mark.parametrize("on_policy", [False, True])
def test_opd_modes_match_the_torch_reference(opd_mode, on_policy):
    # the advantage form's shift A + λ·m·clamp(ℓskill − ℓold, ±clip) (ℓold = sg(ℓθ) on-policy), its sums Σw·m and
    # Σw·shift and no gate; the divergence forms: no teacher term and no teacher sums
    per_token = _per_token(seed=5)
    if on_policy:
        per_token["old_logprob"] = None
    options = LossOptions(**{**OPTIONS, "opd_mode": opd_mode, "opd_adv_clip": 0.5, "opd_coef": 0.7})
    got = tb.token_loss(*per_token.values(), options=options)
    want = _torch_reference(per_token, options)
    keys = {"advantage": {"teacher_weight", "opd_term"}, "gate": {"teacher_weight", "gate", "opd_term"}}
    assert set(got[3]) & {"teacher_weight", "gate", "opd_term"} == keys.get(opd_mode, set())
    _compare(got, want)


def test_advantage_form_by_hand():
    # on-policy, A = 0: token 0 Δ = 2 clipped to 0.5, shift λ·0.5 = 0.25 -> pg = -0.25·ρ, a = -0.25; token 1 Δ = -0.2,
    # shift -0.1 -> a = 0.1; token 2 masked out of the teacher: a = 0
    lp = torch.tensor([-1.0, -1.0, -1.0])
    teacher = lp + torch.tensor([2.0, -0.2, 1.0])
    _, a, _, sums = tb.token_loss(lp, None, None, None, teacher, torch.tensor([True, True, False]), torch.zeros(3),
                                  torch.ones(3), options=LossOptions(dual_clip=None, opd_coef=0.5, opd_mode="advantage",
                                                                     opd_adv_clip=0.5))
    assert_close(a, torch.tensor([-0.25, 0.1, 0.0], dtype=torch.float64), 1e-6, "a")
    assert float(sums["teacher_weight"]) == 2.0 and abs(float(sums["opd_term"]) - 0.15) < 1e-6 and "gate" not in sums


def test_teacher_needs_by_opd_mode():
    per_token = {**_per_token(), "teacher_logprob": None, "teacher_mask": None}
    for mode in ("gate", "advantage"):
        with pytest.raises(ValueError, match="teacher_logprob"):
            tb.token_loss(*per_token.values(), options=LossOptions(**{**OPTIONS, "opd_mode": mode}))
    for mode in ("reverse_kl", "jsd"):  # their term is fused_divergence's: nothing needed here
        _, _, _, sums = tb.token_loss(*per_token.values(), options=LossOptions(**{**OPTIONS, "opd_mode": mode}))
        assert "opd_term" not in sums
    with pytest.raises(ValueError, match="opd_mode"):
        tb.token_loss(*per_token.values(), options=LossOptions(**{**OPTIONS, "opd_mode": "kl"}))
