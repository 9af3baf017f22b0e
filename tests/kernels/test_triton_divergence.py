"""The Triton divergence kernels (interpreter on CPU) against a materialized fp64 reference: values, centers,
normalizers and both gradients of every kind, with NaN in inactive rows, a temperature, V not a multiple of the
tile, bf16, logits of ±1e4, several gradient chunks, student = teacher (exactly 0), shards of W that add up, and
fp16's gradient scale."""

import pytest
import torch

from seedfast.ops import triton_backend
from seedfast.ops import triton_divergence as tb
from tests.kernels.divergence_reference import KINDS, reference_divergence
from tests.kernels.triton_reference import INTERPRETER, TOL, assert_close

pytestmark = INTERPRETER

N, D, V = 37, 32, 64 * 3 + 11  # V: 3 interpreter tiles and a ragged one
BETA = 0.3


def _case(dtype, seed=0, n=N, vocab=V, spread=3.0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, D, generator=g).to(dtype)
    teacher = (hidden.float() + 0.7 * torch.randn(n, D, generator=g)).to(dtype)
    weight = (torch.randn(vocab, D, generator=g) * spread / D**0.5).to(dtype)
    coef = torch.rand(n, generator=g) + 0.1
    if n > 30:
        coef[[3, 17, 30]] = 0.0  # inactive: they hold NaN and Inf
        hidden[3] = float("nan")
        teacher[17] = float("nan")
        hidden[30, 0] = float("inf")
    return hidden, teacher, weight, coef


def _check(hidden, teacher, weight, coef, kind, temperature, rel, chunk=None):
    active = coef != 0
    value, center, lse, tlse = tb.divergence_forward(hidden, teacher, weight, active, kind=kind, beta=BETA,
                                                     temperature=temperature)
    ref = reference_divergence(hidden, teacher, weight, coef, kind, BETA, temperature)
    for name, got in (("value", value), ("center", center), ("lse", lse), ("teacher_lse", tlse)):
        assert got.dtype == torch.float32 and bool((got[~active] == 0).all()), name
        assert_close(got[active], ref[name][active], rel, f"{kind} {name}")
    gh, gw = tb.divergence_backward(hidden, teacher, weight, lse, tlse, center, coef, kind=kind, beta=BETA,
                                    temperature=temperature, chunk=chunk)
    assert gh.dtype == hidden.dtype and gw.dtype == weight.dtype
    assert bool((gh[~active] == 0).all()) and bool(torch.isfinite(gw.float()).all())
    assert_close(gh, ref["grad_hidden"], rel, f"{kind} grad_hidden")
    assert_close(gw, ref["grad_weight"], rel, f"{kind} grad_weight")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_values_and_gradients_against_fp64(kind, dtype):
    # fp32 in several gradient chunks (dH accumulated in fp32), bf16 in one
    _check(*_case(dtype), kind, 0.7, TOL[dtype], chunk=64 if dtype == torch.float32 else None)


@pytest.mark.parametrize("kind", KINDS)
def test_logits_of_1e4(kind):
    # exact integer logits beyond ±1e4, neighbours 125 apart (p one-hot up to e^-125): products, maxima and lse
    # are exact in fp32, so the kernels' arithmetic is what is checked, not fp32's rounding of 1e4
    g = torch.Generator().manual_seed(6)
    sign = (torch.randint(0, 2, (D,), generator=g) * 2 - 1).float()
    weight = (torch.randperm(V, generator=g)[:, None] - V // 2) * 100.0 / D * sign
    hidden = (torch.randint(0, 2, (N, 1), generator=g) * 2 - 1).float() * sign * 1.25
    teacher = torch.roll(hidden, 1, 0) * 1.0
    assert float((hidden @ weight.T).abs().max()) >= 1e4
    coef = torch.ones(N)
    coef[5] = 0.0
    hidden[5] = float("nan")
    _check(hidden, teacher, weight, coef, kind, 1.0, 1e-5)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_student_equal_to_teacher_gives_exactly_zero(kind, dtype):
    hidden, _, weight, coef = _case(dtype, seed=1)
    value, center, lse, tlse = tb.divergence_forward(hidden, hidden, weight, coef != 0, kind=kind, beta=BETA,
                                                     temperature=0.7)
    assert bool((value == 0).all()) and bool((center == 0).all()) and torch.equal(lse, tlse)
    gh, gw = tb.divergence_backward(hidden, hidden, weight, lse, tlse, center, coef, kind=kind, beta=BETA,
                                    temperature=0.7, chunk=64)
    assert bool((gh == 0).all()) and bool((gw == 0).all())


@pytest.mark.parametrize("kind", KINDS)
def test_shards_of_w_with_global_normalizers_add_up(kind):
    hidden, teacher, weight, coef = _case(torch.float32, seed=2)
    active = coef != 0
    value, center, lse, tlse = tb.divergence_forward(hidden, teacher, weight, active, kind=kind, beta=BETA,
                                                     temperature=1.3)
    cut = 100  # not a tile boundary
    parts = [tb.divergence_partial(hidden, teacher, w, active, lse, tlse, kind=kind, beta=BETA, temperature=1.3)
             for w in (weight[:cut], weight[cut:])]
    assert_close(parts[0][0] + parts[1][0], value.double(), 1e-5, "value")
    assert_close(parts[0][1] + parts[1][1], center.double(), 1e-5, "center")
    assert all(bool((p[~active] == 0).all()) for part in parts for p in part)


def test_small_n_and_v_and_frozen_head():
    hidden, teacher, weight, coef = _case(torch.float32, seed=3, n=1, vocab=5)
    _check(hidden, teacher, weight, coef, "jsd", 1.0, 1e-5)
    value, center, lse, tlse = tb.divergence_forward(hidden, teacher, weight, coef != 0, kind="reverse_kl",
                                                     temperature=1.0)
    gh, gw = tb.divergence_backward(hidden, teacher, weight, lse, tlse, center, coef, kind="reverse_kl",
                                    temperature=1.0, need_weight_grad=False)
    assert gw is None and gh.shape == hidden.shape
    assert tb.divergence_backward(hidden, teacher, weight, lse, tlse, center, coef, kind="reverse_kl",
                                  need_hidden_grad=False, need_weight_grad=False) == (None, None)
    empty = tb.divergence_forward(hidden[:0], teacher[:0], weight, coef[:0] != 0, kind="jsd")
    assert all(t.shape == (0,) for t in empty)


@pytest.mark.parametrize("kind", ["reverse_kl", "jsd"])
def test_fp16_gradient_scale(kind, monkeypatch):
    # small coefficients over a 4096-word vocabulary: ∂D/∂z ~ coef/V ~ 5e-8, below fp16's smallest subnormal (6e-8),
    # while dH ~ coef·|W| and dW ~ Σ_t G·h are representable. The launcher scales G by a power of two before
    # rounding it; the control without the scale loses dW.
    hidden, teacher, weight, coef = _case(torch.float32, seed=4, n=64, vocab=4096, spread=3.0 / 8)
    hidden, teacher, weight = (hidden * 8).half(), (teacher * 8).half(), weight.half()
    coef = coef * 2e-4
    ref = reference_divergence(hidden, teacher, weight, coef, kind, BETA, 1.0)
    # the words no token favours: their dW rows are sums of the smallest G entries only, and themselves near fp16's
    # subnormal steps (6e-8): within 10% of their largest entry with the scale, lost (error ~1) without it
    row_max = ref["grad_weight"].abs().amax(1)
    quiet = row_max < row_max.median()
    norm_h, norm_w = 1 / float(ref["grad_hidden"].abs().max()), 1 / float(row_max[quiet].max())

    def grads():
        value, center, lse, tlse = tb.divergence_forward(hidden, teacher, weight, coef != 0, kind=kind, beta=BETA)
        return tb.divergence_backward(hidden, teacher, weight, lse, tlse, center, coef, kind=kind, beta=BETA)

    gh, gw = grads()
    assert_close(gh * norm_h, ref["grad_hidden"] * norm_h, 2e-2, "grad_hidden")
    assert_close(gw[quiet] * norm_w, ref["grad_weight"][quiet] * norm_w, 0.1, "grad_weight of the quiet words")
    monkeypatch.setattr(triton_backend, "_grad_scale", lambda *args: 1.0)
    with pytest.raises(AssertionError):
        assert_close(grads()[1][quiet] * norm_w, ref["grad_weight"][quiet] * norm_w, 0.1, "unscaled")


def test_bad_inputs_raise_one_clear_error():
    hidden, teacher, weight, coef = _case(torch.float32)
    active = coef != 0
    with pytest.raises(ValueError, match="kind"):
        tb.divergence_forward(hidden, teacher, weight, active, kind="kl")
    with pytest.raises(ValueError, match="beta"):
        tb.divergence_forward(hidden, teacher, weight, active, kind="jsd", beta=1.0)
    with pytest.raises(ValueError, match="teacher_hidden"):
        tb.divergence_forward(hidden, teacher[:-1], weight, active, kind="jsd")
    with pytest.raises(ValueError, match="active"):
        tb.divergence_forward(hidden, teacher, weight, coef, kind="jsd")
    with pytest.raises(ValueError, match="temperature"):
        tb.divergence_forward(hidden, teacher, weight, active, kind="jsd", temperature=0.0)
