"""fused_divergence (torch backend) against a materialized fp64 reference written here: values and gradients w.r.t.
the student's hidden rows and W of every kind, on both of the backend's paths (blocks of whole vocabulary rows, streamed
tiles), with adversarial inputs: rows of weight 0 holding NaN, logits of ±1e4, a vocabulary that is not a multiple of
the tile, bf16 inputs, temperature, and a student equal to its teacher (exactly 0)."""

import pytest
import torch

from seedfast.ops import chunked, divergence_kind, fused_divergence
from seedfast.ops import chunked_divergence as cd

D, V = 16, 101  # V: prime, no tile divides it
KINDS = [("reverse_kl", 1.0), ("forward_kl", 0.0), ("jsd", 0.5), ("jsd", 0.1), ("jsd", 0.9)]


def reference(hidden, teacher_hidden, weight, weights, kind, beta, temperature=1.0):
    """(loss, D [N], ∂loss/∂hidden, ∂loss/∂W), materialized logits in fp64 (TRL's GKD formulas for the JSD)."""
    h = hidden.detach().double().requires_grad_()
    w = weight.detach().double().requires_grad_()
    log_s = torch.log_softmax(h @ w.t() / temperature, -1)
    log_t = torch.log_softmax(teacher_hidden.detach().double() @ weight.detach().double().t() / temperature, -1)
    if kind == "reverse_kl":
        value = (log_s.exp() * (log_s - log_t)).sum(-1)
    elif kind == "forward_kl":
        value = (log_t.exp() * (log_t - log_s)).sum(-1)
    else:
        b = torch.tensor(beta, dtype=torch.float64)
        log_m = torch.logsumexp(torch.stack([log_s + torch.log(1 - b), log_t + torch.log(b)]), 0)
        value = b * (log_t.exp() * (log_t - log_m)).sum(-1) + (1 - b) * (log_s.exp() * (log_s - log_m)).sum(-1)
    active = weights != 0
    loss = (weights.double()[active] * value[active]).sum()
    loss.backward()
    return loss.detach(), torch.where(active, value.detach(), 0.0), h.grad, w.grad


@pytest.fixture(params=["whole-rows", "tiles"])
def path(request, monkeypatch):
    if request.param == "whole-rows":
        monkeypatch.setenv(cd.DIVERGENCE_BYTES_ENV, str(cd.LIVE_TILES * 4 * V * 8))  # blocks of 8 rows
        monkeypatch.setattr(cd, "MIN_BLOCK_ROWS", 4)
    else:  # a block of whole rows does not fit: streamed 16 × 32 tiles
        monkeypatch.setenv(cd.DIVERGENCE_BYTES_ENV, "64")
        monkeypatch.setenv("SEEDFAST_OPS_TILE_BYTES", "2048")
    return request.param


def problem(n=29, seed=0, scale=2.0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    hidden = (scale * torch.randn(n, D, generator=gen)).to(dtype).requires_grad_()
    teacher = (hidden.detach().float() + 0.7 * torch.randn(n, D, generator=gen)).to(dtype)
    weight = torch.randn(V, D, generator=gen).to(dtype).requires_grad_()
    weights = torch.rand(n, generator=gen)
    weights[[2, 7]] = 0.0
    return hidden, teacher, weight, weights


def assert_close(got, want, rtol, atol):
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol)


@pytest.mark.parametrize(("kind", "beta"), KINDS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_value_and_gradients_match_the_fp64_materialized_reference(path, kind, beta, temperature):
    hidden, teacher, weight, weights = problem()
    loss, value = fused_divergence(hidden, teacher, weight, token_weights=weights, kind=kind, beta=beta,
                                   temperature=temperature, backend="torch")
    loss.backward()
    want_loss, want_value, want_dh, want_dw = reference(hidden, teacher, weight, weights, kind, beta, temperature)
    assert_close(loss, want_loss, 1e-5, 1e-5)
    assert_close(value, want_value, 1e-5, 1e-5)
    assert_close(hidden.grad, want_dh, 1e-4, 1e-5)
    assert_close(weight.grad, want_dw, 1e-4, 1e-5)
    assert (value[[2, 7]] == 0).all()


@pytest.mark.parametrize(("kind", "beta"), KINDS)
def test_rows_of_weight_zero_holding_nan_leave_no_trace(path, kind, beta):
    hidden, teacher, weight, weights = problem()
    with torch.no_grad():
        hidden[2] = float("nan")
        teacher[7] = float("inf")
    loss, value = fused_divergence(hidden, teacher, weight, token_weights=weights, kind=kind, beta=beta,
                                   backend="torch")
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(value).all()
    assert torch.isfinite(hidden.grad).all() and torch.isfinite(weight.grad).all()
    assert (hidden.grad[[2, 7]] == 0).all()
    clean = weights != 0
    _, want_value, _, _ = reference(hidden.detach()[clean], teacher[clean], weight, weights[clean], kind, beta)
    assert_close(value[clean], want_value, 1e-5, 1e-5)


@pytest.mark.parametrize(("kind", "beta"), KINDS)
def test_a_student_equal_to_its_teacher_gives_exactly_zero(path, kind, beta):
    hidden, _, weight, weights = problem()
    loss, value = fused_divergence(hidden, hidden.detach().clone(), weight, token_weights=weights, kind=kind,
                                   beta=beta, backend="torch")
    loss.backward()
    assert float(loss.detach()) == 0.0 and (value == 0).all()
    assert (hidden.grad == 0).all() and (weight.grad == 0).all()


@pytest.mark.parametrize(("kind", "beta"), KINDS)
def test_logits_of_1e4(path, kind, beta):
    # logits up to ±1e4: fp32 rounds them to ~1e-3, the tolerance the comparison grants
    hidden, teacher, weight, weights = problem(scale=600.0)
    loss, value = fused_divergence(hidden, teacher, weight, token_weights=weights, kind=kind, beta=beta,
                                   backend="torch")
    loss.backward()
    assert (hidden.detach() @ weight.detach().t()).abs().max() > 5e3
    want_loss, want_value, want_dh, want_dw = reference(hidden, teacher, weight, weights, kind, beta)
    assert torch.isfinite(value).all() and torch.isfinite(hidden.grad).all() and torch.isfinite(weight.grad).all()
    assert_close(value, want_value, 1e-4, 5e-2)
    assert_close(hidden.grad, want_dh, 1e-3, 5e-2)
    assert_close(weight.grad, want_dw, 1e-3, 5e-2)


@pytest.mark.parametrize(("kind", "beta"), KINDS)
def test_bf16_inputs_match_the_reference_of_the_same_bf16_numbers(path, kind, beta):
    hidden, teacher, weight, weights = problem(dtype=torch.bfloat16)
    loss, value = fused_divergence(hidden, teacher, weight, token_weights=weights, kind=kind, beta=beta,
                                   backend="torch")
    loss.backward()
    assert hidden.grad.dtype == torch.bfloat16 and weight.grad.dtype == torch.bfloat16
    want_loss, want_value, want_dh, want_dw = reference(hidden, teacher, weight, weights, kind, beta)
    assert_close(value, want_value, 1e-4, 1e-4)  # fp32 arithmetic on bf16 numbers
    assert_close(hidden.grad, want_dh, 2e-2, 2e-3)  # one bf16 rounding of the result
    assert_close(weight.grad, want_dw, 2e-2, 2e-3)


def test_no_grad_gives_the_same_value_and_the_weights_scale_the_loss():
    hidden, teacher, weight, weights = problem()
    loss, value = fused_divergence(hidden, teacher, weight, token_weights=weights, kind="jsd", beta=0.3)
    with torch.no_grad():
        loss_ng, value_ng = fused_divergence(hidden, teacher, weight, token_weights=weights, kind="jsd", beta=0.3)
    assert_close(value_ng, value, 1e-5, 1e-6)
    assert_close(loss_ng, (weights * value).sum(), 1e-5, 1e-6)


def test_a_frozen_head_gets_no_weight_gradient_and_the_teacher_none():
    hidden, teacher, weight, weights = problem()
    weight.requires_grad_(False)
    teacher.requires_grad_()
    loss, _ = fused_divergence(hidden, teacher, weight, token_weights=weights, kind="reverse_kl")
    loss.backward()
    assert weight.grad is None and teacher.grad is None and hidden.grad is not None


def test_the_loss_gradient_is_scaled_by_what_flows_in():
    hidden, teacher, weight, weights = problem()
    loss, _ = fused_divergence(hidden, teacher, weight, token_weights=weights, kind="reverse_kl")
    (0.25 * loss).backward()
    _, _, want_dh, _ = reference(hidden, teacher, weight, weights, "reverse_kl", 1.0)
    assert_close(hidden.grad, 0.25 * want_dh, 1e-4, 1e-6)


def test_the_backend_module_exposes_the_protocol():
    for name in ("divergence_forward", "divergence_partial", "divergence_backward", "divergence_forward_backward"):
        assert callable(getattr(chunked, name))


def test_partial_sums_over_two_shards_of_w_with_the_global_normalizers_give_the_whole():
    hidden, teacher, weight, weights = problem()
    active = weights != 0
    with torch.no_grad():
        for kind, beta in KINDS:
            value, center, lse, tlse = chunked.divergence_forward(hidden, teacher, weight, active, kind=kind,
                                                                  beta=beta, temperature=1.0)
            parts = [chunked.divergence_partial(hidden, teacher, shard, active, lse, tlse, kind=kind, beta=beta,
                                                temperature=1.0) for shard in (weight[:40], weight[40:])]
            assert_close(parts[0][0] + parts[1][0], value, 1e-5, 1e-5)
            assert_close(parts[0][1] + parts[1][1], center, 1e-5, 1e-5)


@pytest.mark.parametrize(("mode", "beta", "want"), [("reverse_kl", 0.3, ("reverse_kl", 1.0)),
                                                    ("jsd", 0.0, ("forward_kl", 0.0)),
                                                    ("jsd", 1.0, ("reverse_kl", 1.0)),
                                                    ("jsd", 0.4, ("jsd", 0.4))])
def test_the_forms_map_to_kinds_as_trl_defines_the_ends(mode, beta, want):
    assert divergence_kind(mode, beta) == want


@pytest.mark.parametrize(("change", "message"), [
    ({"teacher_hidden": torch.zeros(3, D)}, "teacher_hidden has shape"),
    ({"weight": torch.zeros(V, D + 1)}, "weight \\[V, d\\] has d"),
    ({"token_weights": torch.zeros(4)}, "token_weights must be \\[N\\]"),
    ({"kind": "kl"}, "unknown kind='kl'"),
    ({"kind": "jsd", "beta": 1.0}, "needs 0 < beta < 1"),
    ({"temperature": 0.0}, "temperature must be finite and > 0"),
])
def test_bad_input_is_one_clear_error_naming_it(change, message):
    hidden, teacher, weight, weights = problem(n=9)
    args = {"teacher_hidden": teacher, "weight": weight, "token_weights": weights, "kind": "reverse_kl", "beta": 0.5,
            "temperature": 1.0, **change}
    with pytest.raises(ValueError, match=message):
        fused_divergence(hidden, args.pop("teacher_hidden"), args.pop("weight"), **args)
