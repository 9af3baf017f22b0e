"""The training loss in one pass (triton_backend.fused_forward_backward, seedfast/kernels/fused_rows.py) under the
interpreter, against fp64 references built from materialized log_softmax: the loss and a_t, b_t by the formulas
of docs/algorithms.md (triton_reference.reference_token_loss), the gradients by fp64 autograd of Σ a·ℓ + Σ b·H.
Adversarial inputs: odd V, all-negative logits, logits of magnitude 1e4, ignored targets, temperature, N = 0,
bf16 (with the interpreter patch of conftest.py), several row blocks (the last one ragged), a frozen head."""

import pytest
import torch

from seedfast.ops import LossOptions, fused_loss
from seedfast.ops import triton_backend as tb
from tests.kernels.kernel_cases import OPTIONS, D, N, V, all_negative_case, huge_case, random_case
from tests.kernels.triton_reference import (
    INTERPRETER,
    TOL,
    assert_close,
    reference_grads,
    reference_logprob,
    reference_token_loss,
)

pytestmark = INTERPRETER



def _per_token(n, logprob_hint, seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(
        old_logprob=logprob_hint + torch.randn(n, generator=g) * 0.3,
        ref_logprob=logprob_hint + torch.randn(n, generator=g),
        teacher_logprob=logprob_hint + torch.randn(n, generator=g),
        teacher_mask=torch.rand(n, generator=g) > 0.3,
        advantages=torch.randn(n, generator=g),
        token_weights=torch.rand(n, generator=g) / n,
    )


def _reference(hidden, weight, targets, per_token, temperature, options):
    """fp64 (loss, logprob, grad_hidden, grad_weight)."""
    lp, ent, _, _ = reference_logprob(hidden, weight, targets, None, temperature)
    w = torch.where(targets == -100, 0.0, per_token["token_weights"].double())
    loss, a, b, _ = reference_token_loss(lp, ent, **{**per_token, "token_weights": w}, **options)
    gh, gw = reference_grads(hidden, weight, targets, a.detach(), None if b is None else b.detach(), temperature)
    return loss, lp, gh, gw


def _run(hidden, weight, targets, per_token, temperature, options, rows, need=(True, True)):
    per_token = {**per_token,
                 "token_weights": torch.where(targets == -100, 0.0, per_token["token_weights"].float())}
    with_entropy = options["entropy_coef"] != 0 or (options["opd_coef"] != 0 and options["gate"] != "gap")
    tb.reset_path_counts()
    out = tb.fused_forward_backward(hidden, weight, targets, temperature=temperature, ignore_index=-100,
                                    with_entropy=with_entropy, per_token=per_token, options=LossOptions(**options),
                                    need_hidden_grad=need[0], need_weight_grad=need[1], rows=rows)
    # the single pass ran, not its two-pass fallback (which gives the same numbers)
    assert tb.fused_path_taken(tb.path_counts()) == ("two_pass:empty" if hidden.shape[0] == 0 else "single_pass")
    assert "forward" not in tb.path_counts() and "backward.two_pass" not in tb.path_counts()
    return out


def _check(hidden, weight, targets, temperature=0.7, options=OPTIONS, rows=None, rel=None):
    rel = rel or TOL[hidden.dtype]
    lp_hint = reference_logprob(hidden, weight, targets, None, temperature)[0].float()
    per_token = _per_token(hidden.shape[0], lp_hint)
    loss, sums, gh, gw, logprob = _run(hidden, weight, targets, per_token, temperature, options, rows)
    ref_loss, ref_lp, ref_gh, ref_gw = _reference(hidden, weight, targets, per_token, temperature, options)
    assert gh.dtype == hidden.dtype and gw.dtype == weight.dtype
    assert_close(loss, ref_loss, rel, "loss")
    assert_close(logprob, ref_lp, rel, "logprob")
    assert_close(gh, ref_gh, rel, "grad_hidden")
    assert_close(gw, ref_gw, rel, "grad_weight")
    assert bool((gh[targets == -100] == 0).all()) and bool((logprob[targets == -100] == 0).all())
    assert bool(torch.isfinite(gh.float()).all()) and bool(torch.isfinite(gw.float()).all())
    return sums


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [None, 16])  # one block of all rows; 3 blocks (16 + 16 + 13): dW accumulates
def test_single_pass_matches_fp64(dtype, rows):
    _check(*random_case(dtype), rows=rows)


@pytest.mark.parametrize("gate,entropy_coef", [("entropy", 0.0), ("soft_or", 0.02), ("gap", 0.0)])
def test_single_pass_loss_variants(gate, entropy_coef):
    # With the entropy only in the gate there is no b term (b = None); with gap and no entropy no H at all.
    options = {**OPTIONS, "gate": gate, "entropy_coef": entropy_coef}
    _check(*random_case(torch.float32, seed=3), temperature=1.3, options=options, rows=32)


@pytest.mark.parametrize("case", [all_negative_case, huge_case])
def test_single_pass_extreme_logits(case):
    # fp32 logits of magnitude 1e3..1e4 carry an absolute rounding of ~1e-4..1e-3 (their ulp), which reaches the
    # log-probs and the loss: a tolerance of 1e-5 would test fp32's ulp, not the kernels.
    _check(*case(), temperature=1.0, rows=16, rel=2e-4)


def test_single_pass_zero_tokens():
    hidden, weight, targets = random_case(torch.float32, n=0)
    per_token = _per_token(0, torch.zeros(0))
    loss, sums, gh, gw, logprob = _run(hidden, weight, targets, per_token, 1.0, OPTIONS, None)
    assert float(loss) == 0.0 and logprob.shape == (0,) and gh.shape == (0, D)
    assert gw.shape == weight.shape and bool((gw == 0).all())
    assert float(sums["weight"]) == 0.0


def test_single_pass_frozen_head_and_gradients_it_skips():
    hidden, weight, targets = random_case(torch.float32, seed=4)
    per_token = _per_token(N, torch.zeros(N))
    full = _run(hidden, weight, targets, per_token, 1.0, OPTIONS, 16)
    only_h = _run(hidden, weight, targets, per_token, 1.0, OPTIONS, 16, need=(True, False))
    only_w = _run(hidden, weight, targets, per_token, 1.0, OPTIONS, 16, need=(False, True))
    assert only_h[3] is None and only_w[2] is None
    assert torch.equal(only_h[2], full[2]) and torch.equal(only_w[3], full[3])
    assert torch.equal(only_h[0], full[0])


def test_fused_loss_uses_the_single_pass_and_agrees_with_the_torch_backend(monkeypatch):
    # Through the public op: the triton backend runs fused_forward_backward (the logits GEMM launches once per
    # block, no recomputation) and gives the torch backend's loss, metrics and gradients.
    launched = []
    original = tb._matmul
    monkeypatch.setattr(tb, "_matmul", lambda *args: (launched.append(args[-1]), original(*args))[1])
    monkeypatch.setenv("SEEDFAST_TRITON_FUSED_MB", str(16 * V * 4 / 2**20))  # 16 rows of fp32 logits
    monkeypatch.setattr(tb, "FUSED_MIN_ROWS", 0)
    results = {}
    tb.reset_path_counts()
    for backend in ("torch", "triton"):
        hidden, weight, targets = random_case(torch.float32, seed=5)
        hidden.requires_grad_()
        weight.requires_grad_()
        per_token = _per_token(N, torch.full((N,), -5.0))
        loss, metrics = fused_loss(hidden, weight, targets, **per_token, options=LossOptions(**OPTIONS),
                                   temperature=0.9, backend=backend)
        loss.backward()
        results[backend] = (loss.detach(), metrics, hidden.grad, weight.grad)
    # 16 rows fit: 3 balanced blocks of 15 rows, each with its logits GEMM once and its dH and dW GEMMs.
    assert tb.choose_fused_rows(N, V, 4) == 15
    assert launched.count("matmul_logits") == launched.count("matmul_dh") == launched.count("matmul_dw") == 3
    assert tb.path_counts().get("fused.single_pass") == 1 and "forward" not in tb.path_counts()
    (loss_t, m_t, gh_t, gw_t), (loss_g, m_g, gh_g, gw_g) = results["torch"], results["triton"]
    assert_close(loss_g, loss_t.double(), 1e-5, "loss")
    assert_close(gh_g, gh_t.double(), 1e-5, "grad_hidden")
    assert_close(gw_g, gw_t.double(), 1e-5, "grad_weight")
    assert set(m_g) == set(m_t)
    for key in m_t:
        assert_close(m_g[key], m_t[key].double(), 1e-5, key)


def test_fused_rows_choice():
    # A block is whole 128-row tiles within the budget, balanced over the tokens; too small a block falls back.
    vocab = 152064
    per_row = vocab * 6  # fp32 logits + bf16 G
    rows = tb.choose_fused_rows(16384, vocab, 2)
    assert rows % 128 == 0 and rows * per_row <= 2048 * 2**20 and 16384 / rows <= 8
    assert tb.choose_fused_rows(500, vocab, 2) == 500  # everything fits: one block of exactly N rows
    assert tb.choose_fused_rows(16384, 10 * vocab, 2) == 0  # < FUSED_MIN_ROWS rows fit: two-pass path
