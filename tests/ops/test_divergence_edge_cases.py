"""Edge cases of fused_divergence's torch backend (issue #53): a far-tail vocabulary entry whose log-ratio
r = log p_t − log p_s is 95 to 183 nats (p_s·e^r overflows fp32: the forward KL and the JSD must still be finite and
equal a materialized fp64 reference, value and gradients), temperature and token weights that are not finite (one
clear ValueError naming them), and a second backward through the vocabulary-parallel divergence (one clear
RuntimeError, not gradients silently dropped)."""

import math
import socket

import pytest
import torch
import torch.distributed as dist

from seedfast.ops import chunked_divergence as cd
from seedfast.ops import fused_divergence
from seedfast.ops.vocab_parallel import vocab_parallel_divergence

D, V = 16, 101  # V: prime, no tile divides it
TAIL = 37  # the far-tail vocabulary entry
KINDS = [("reverse_kl", 1.0), ("forward_kl", 0.0), ("jsd", 0.5), ("jsd", 0.1), ("jsd", 0.9)]


def reference(hidden, teacher_hidden, weight, weights, kind, beta, temperature=1.0):
    """(loss, D [N], ∂loss/∂hidden, ∂loss/∂W) from materialized fp64 log-softmaxes; M of the JSD as a logsumexp,
    so no term is ever formed as p_s·e^r."""
    h = hidden.detach().double().requires_grad_()
    w = weight.detach().double().requires_grad_()
    log_s = torch.log_softmax(h @ w.t() / temperature, -1)
    log_t = torch.log_softmax(teacher_hidden.detach().double() @ weight.detach().double().t() / temperature, -1)
    if kind == "reverse_kl":
        value = (log_s.exp() * (log_s - log_t)).sum(-1)
    elif kind == "forward_kl":
        value = (log_t.exp() * (log_t - log_s)).sum(-1)
    else:
        log_m = torch.logsumexp(torch.stack([log_s + math.log(1 - beta), log_t + math.log(beta)]), 0)
        value = beta * (log_t.exp() * (log_t - log_m)).sum(-1) + (1 - beta) * (log_s.exp() * (log_s - log_m)).sum(-1)
    loss = (weights.double() * value).sum()
    loss.backward()
    return loss.detach(), value.detach(), h.grad, w.grad


@pytest.fixture(params=["whole-rows", "tiles"])
def path(request, monkeypatch):
    if request.param == "whole-rows":
        monkeypatch.setenv(cd.DIVERGENCE_BYTES_ENV, str(cd.LIVE_TILES * 4 * V * 8))  # blocks of 8 rows
        monkeypatch.setattr(cd, "MIN_BLOCK_ROWS", 4)
    else:  # a block of whole rows does not fit: streamed 16 × 32 tiles
        monkeypatch.setenv(cd.DIVERGENCE_BYTES_ENV, "64")
        monkeypatch.setenv("SEEDFAST_OPS_TILE_BYTES", "2048")
    return request.param


def assert_close(got, want, rtol, atol):
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol)


def test_the_reference_gives_the_hand_computed_values():
    # logits are the hidden rows (W = I): p_s = (1/2, 1/2), p_t = (1/4, 3/4), M = (3/8, 5/8) at β = 1/2
    eye = torch.eye(2, dtype=torch.float64)
    hidden, teacher = torch.zeros(1, 2, dtype=torch.float64), torch.tensor([[0.0, math.log(3.0)]], dtype=torch.float64)
    ones = torch.ones(1, dtype=torch.float64)
    forward = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
    reverse = 0.5 * math.log(2.0) + 0.5 * math.log(2.0 / 3.0)
    jsd = 0.5 * (0.25 * math.log(0.25 / 0.375) + 0.75 * math.log(0.75 / 0.625)) \
        + 0.5 * (0.5 * math.log(0.5 / 0.375) + 0.5 * math.log(0.5 / 0.625))
    for kind, beta, want in (("forward_kl", 0.0, forward), ("reverse_kl", 1.0, reverse), ("jsd", 0.5, jsd)):
        _, value, grad_h, _ = reference(hidden, teacher, eye, ones, kind, beta)
        assert float(value[0]) == pytest.approx(want, rel=1e-12)
        if kind == "forward_kl":  # ∂D/∂z_s = p_s − p_t
            assert grad_h[0].tolist() == pytest.approx([0.25, -0.25], rel=1e-12)
        _, got = fused_divergence(hidden, teacher, eye, token_weights=ones, kind=kind, beta=beta, backend="torch")
        assert float(got[0]) == pytest.approx(want, rel=1e-6)


def far_tail_problem(low: float, high: float = 8.0, n: int = 12, seed: int = 0):
    """Hidden rows whose student logit at TAIL is `low` (+ noise) and teacher logit `high` on rows 0, 3 and 5 (so
    r ≈ high − low + log V there), an ordinary student/teacher pair elsewhere."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, D, generator=gen)
    teacher = hidden + 0.5 * torch.randn(n, D, generator=gen)
    weight = torch.randn(V, D, generator=gen)
    weight[:, 0] = 0.0
    weight[TAIL, 0] = 1.0  # dimension 0 of a hidden row moves the logit of TAIL alone
    tail_rows = [0, 3, 5]
    hidden[tail_rows, 0] = low
    teacher[tail_rows, 0] = high
    weights = torch.rand(n, generator=gen) + 0.5
    return hidden.requires_grad_(), teacher, weight.requires_grad_(), weights, tail_rows


@pytest.mark.parametrize(("kind", "beta"), KINDS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
# r of 95 to 183 nats: e^r is inf in fp32 (beyond e^88.7), p_s of TAIL a subnormal (inf) or 0 (0·inf = NaN)
@pytest.mark.parametrize("low", [-90.0, -120.0])
def test_a_far_tail_log_ratio_beyond_fp32_exp_stays_finite_and_exact(path, kind, beta, temperature, low):
    hidden, teacher, weight, weights, tail_rows = far_tail_problem(low)
    with torch.no_grad():
        log_s = torch.log_softmax(hidden @ weight.t() / temperature, -1)
        log_t = torch.log_softmax(teacher @ weight.t() / temperature, -1)
        r = (log_t - log_s)[tail_rows, TAIL]
        assert (r > 90).all() and not torch.isfinite(log_s[tail_rows, TAIL].exp() * r.exp()).all()
    loss, value = fused_divergence(hidden, teacher, weight, token_weights=weights, kind=kind, beta=beta,
                                   temperature=temperature, backend="torch")
    loss.backward()
    want_loss, want_value, want_dh, want_dw = reference(hidden, teacher, weight, weights, kind, beta, temperature)
    assert torch.isfinite(value).all() and torch.isfinite(loss)
    assert torch.isfinite(hidden.grad).all() and torch.isfinite(weight.grad).all()
    assert_close(value, want_value, 1e-5, 1e-4)
    assert_close(loss, want_loss, 1e-5, 1e-4)
    assert_close(hidden.grad, want_dh, 1e-4, 1e-4)
    assert_close(weight.grad, want_dw, 1e-4, 1e-4)


@pytest.mark.parametrize(("kind", "beta"), KINDS)
def test_a_far_tail_value_without_grad_and_the_partial_sums_stay_finite(path, kind, beta):
    hidden, teacher, weight, weights, _ = far_tail_problem(-120.0)
    _, want_value, _, _ = reference(hidden, teacher, weight, weights, kind, beta)
    with torch.no_grad():
        _, value = fused_divergence(hidden, teacher, weight, token_weights=weights, kind=kind, beta=beta,
                                    backend="torch")
        assert_close(value, want_value, 1e-5, 1e-4)
        active = weights != 0
        _, _, lse, tlse = cd.divergence_forward(hidden, teacher, weight, active, kind=kind, beta=beta,
                                                temperature=1.0)
        parts = [cd.divergence_partial(hidden, teacher, shard, active, lse, tlse, kind=kind, beta=beta,
                                       temperature=1.0)[0] for shard in (weight[:TAIL + 1], weight[TAIL + 1:])]
    assert_close(parts[0] + parts[1], want_value, 1e-5, 1e-4)


def _args(n: int = 9):
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(n, D, generator=gen)
    return hidden, hidden + 0.3 * torch.randn(n, D, generator=gen), torch.randn(V, D, generator=gen), torch.ones(n)


@pytest.mark.parametrize(("temperature", "shown"), [(math.inf, "inf"), (-math.inf, "-inf"), (math.nan, "nan"),
                                                    (0.0, "0.0"), (-1.0, "-1.0")])
def test_a_temperature_that_is_not_finite_and_positive_is_one_clear_error(temperature, shown):
    hidden, teacher, weight, weights = _args()
    message = f"^fused_divergence: temperature must be finite and > 0, got {shown}$"
    with pytest.raises(ValueError, match=message):
        fused_divergence(hidden, teacher, weight, token_weights=weights, temperature=temperature)


def test_token_weights_holding_nan_or_inf_are_one_clear_error():
    hidden, teacher, weight, weights = _args()
    weights[[7, 8]] = float("nan")
    weights[[4]] = -float("inf")
    hidden.requires_grad_()
    with pytest.raises(ValueError, match=r"^fused_divergence: token_weights holds 3 non-finite values "
                                         r"\(first at row 4\)$"):
        fused_divergence(hidden, teacher, weight, token_weights=weights)
    weights[[4, 7]] = 1.0
    with pytest.raises(ValueError, match=r"holds 1 non-finite value \(first at row 8\)$"), torch.no_grad():
        fused_divergence(hidden, teacher, weight, token_weights=weights)


@pytest.fixture
def one_rank_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(("kind", "beta"), KINDS)
def test_vocab_parallel_divergence_on_one_rank_matches_the_reference(one_rank_group, kind, beta):
    hidden, teacher, weight, weights = _args()
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss, value = vocab_parallel_divergence(h, w, teacher, token_weights=weights, kind=kind, beta=beta,
                                            temperature=0.8, backend="torch")
    loss.backward()
    want_loss, want_value, want_dh, want_dw = reference(hidden, teacher, weight, weights, kind, beta, 0.8)
    assert_close(value, want_value, 1e-5, 1e-5)
    assert_close(h.grad, want_dh, 1e-4, 1e-5)
    assert_close(w.grad, want_dw, 1e-4, 1e-5)


def test_a_second_vocab_parallel_backward_is_one_clear_error_not_dropped_gradients(one_rank_group):
    hidden, teacher, weight, weights = _args()
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss, _ = vocab_parallel_divergence(h, w, teacher, token_weights=weights, kind="forward_kl", backend="torch")
    loss.backward(retain_graph=True)
    first_h, first_w = h.grad.clone(), w.grad.clone()
    with pytest.raises(RuntimeError, match="^vocab_parallel_divergence: backward ran twice"):
        loss.backward()
    assert torch.equal(h.grad, first_h) and torch.equal(w.grad, first_w)


def test_the_vocab_parallel_divergence_checks_its_inputs_as_fused_divergence_does(one_rank_group):
    hidden, teacher, weight, weights = _args()
    with pytest.raises(ValueError, match="^vocab_parallel_divergence: temperature must be finite and > 0, got inf$"):
        vocab_parallel_divergence(hidden, weight, teacher, token_weights=weights, temperature=math.inf)
    weights[2] = float("nan")
    with pytest.raises(ValueError, match=r"^vocab_parallel_divergence: token_weights holds 1 non-finite value "
                                         r"\(first at row 2\)$"):
        vocab_parallel_divergence(hidden, weight, teacher, token_weights=weights)


def test_fused_divergence_second_backward_stays_one_clear_error():
    hidden, teacher, weight, weights = _args()
    hidden.requires_grad_()
    loss, _ = fused_divergence(hidden, teacher, weight, token_weights=weights, kind="jsd", beta=0.5)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()
