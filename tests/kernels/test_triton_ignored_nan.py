"""A padded or ignored row may hold anything: NaN in its hidden state (a fully masked attention row) and in its
upstream gradient. It must contribute exactly 0 to dW and dH on every path: masking it by a = b = 0 is not enough
(0·NaN = NaN in G, and again in Gᵀ·H). Triton under the interpreter (single pass in one and in three row blocks, the
two-pass path, linear_logprob's backward) and the chunked torch backend, against fp64 references computed with the
ignored rows' contents replaced by zeros (which they must not influence)."""

import pytest
import torch

from seedfast.ops import LossOptions, chunked
from seedfast.ops import triton_backend as tb
from tests.kernels.kernel_cases import OPTIONS, D, N, V, random_case
from tests.kernels.triton_reference import (
    INTERPRETER,
    TOL,
    assert_close,
    reference_grads,
    reference_logprob,
    reference_token_loss,
)

pytestmark = INTERPRETER


def _poisoned(dtype):
    hidden, weight, targets = random_case(dtype, seed=11)
    ignored = targets == -100
    assert int(ignored.sum()) == 3
    poisoned = hidden.clone()
    poisoned[ignored] = float("nan")
    poisoned[ignored.nonzero()[0, 0], 0] = float("inf")
    clean = hidden.masked_fill(ignored[:, None], 0.0)
    return poisoned, clean, weight, targets, ignored


def _per_token(targets, lp_hint):
    g = torch.Generator().manual_seed(1)
    n = targets.shape[0]
    return dict(old_logprob=lp_hint + torch.randn(n, generator=g) * 0.3,
                ref_logprob=lp_hint + torch.randn(n, generator=g),
                teacher_logprob=lp_hint + torch.randn(n, generator=g),
                teacher_mask=torch.rand(n, generator=g) > 0.3,
                advantages=torch.randn(n, generator=g),
                token_weights=torch.where(targets == -100, 0.0, torch.rand(n, generator=g) / n))


def _check_grads(gh, gw, clean, weight, targets, ignored, a, b, rel):
    assert bool(torch.isfinite(gh.float()).all()) and bool(torch.isfinite(gw.float()).all())
    assert bool((gh[ignored] == 0).all())
    ref_gh, ref_gw = reference_grads(clean, weight, targets, a, b, 0.8)
    assert_close(gh, ref_gh, rel, "grad_hidden")
    assert_close(gw, ref_gw, rel, "grad_weight")


@pytest.mark.parametrize("backend", ["triton", "chunked"])
@pytest.mark.parametrize("rows", [None, 16, 0])  # one block; three blocks (dW accumulates); 0: the two-pass path
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_loss_ignored_rows_with_nan_contribute_nothing(backend, rows, dtype):
    if backend == "chunked" and rows is not None:
        pytest.skip("the chunked backend picks its own blocks")
    hidden, clean, weight, targets, ignored = _poisoned(dtype)
    lp, ent, _, _ = reference_logprob(clean, weight, targets, None, 0.8)
    per_token = _per_token(targets, lp.float())
    kwargs = dict(temperature=0.8, ignore_index=-100, with_entropy=True, per_token=per_token,
                  options=LossOptions(**OPTIONS))
    if backend == "triton":
        loss, _, gh, gw, logprob = tb.fused_forward_backward(hidden, weight, targets, rows=rows, **kwargs)
    else:
        loss, _, gh, gw, logprob = chunked.fused_forward_backward(hidden, weight, targets, **kwargs)
    ref_loss, a, b, _ = reference_token_loss(lp, ent, **per_token, **OPTIONS)
    assert_close(loss, ref_loss, TOL[dtype], "loss")
    assert bool((logprob[ignored] == 0).all()) and bool(torch.isfinite(logprob).all())
    _check_grads(gh, gw, clean, weight, targets, ignored, a.detach(), b.detach(), TOL[dtype])


@pytest.mark.parametrize("backend", ["triton", "chunked"])
def test_linear_logprob_backward_ignored_rows_with_nan_contribute_nothing(backend):
    hidden, clean, weight, targets, ignored = _poisoned(torch.float32)
    g = torch.Generator().manual_seed(2)
    grad_lp = torch.randn(N, generator=g).masked_fill(ignored, float("nan"))
    grad_ent = torch.randn(N, generator=g).masked_fill(ignored, float("inf"))
    impl = tb if backend == "triton" else chunked
    _, entropy, _, lse = impl.forward(hidden, weight, targets, None, 0.8, True, -100)
    gh, gw = impl.backward(hidden, weight, targets, lse, entropy, grad_lp, grad_ent, 0.8, -100)
    assert gh.shape == (N, D) and gw.shape == (V, D)
    _check_grads(gh, gw, clean, weight, targets, ignored, grad_lp.masked_fill(ignored, 0.0),
                 grad_ent.masked_fill(ignored, 0.0), TOL[torch.float32])
