"""Backward of the linear log-prob op (interpreter on CPU): grad_hidden and grad_weight against fp64 autograd."""

import pytest
import torch

from seedfast.kernels import configs
from seedfast.ops import triton_backend as tb
from tests.kernels.triton_reference import INTERPRETER, TOL, assert_close, reference_grads

pytestmark = INTERPRETER

TILE_V = configs.INTERPRET_GRAD_LOGITS["BLOCK_V"]
N, D, V = 45, 40, TILE_V * 4 + 7


def _inputs(dtype, seed=0, n=N, vocab=V):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, D, generator=g).to(dtype)
    weight = (torch.randn(vocab, D, generator=g) / D**0.5 * 3).to(dtype)
    targets = torch.randint(0, vocab, (n,), generator=g)
    targets[[i for i in (3, 17, 40) if i < n]] = -100
    grad_logprob = torch.randn(n, generator=g)
    grad_entropy = torch.randn(n, generator=g)
    return hidden, weight, targets, grad_logprob, grad_entropy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_entropy_grad", [False, True])
@pytest.mark.parametrize("chunk", [None, 2 * TILE_V])  # one vocabulary chunk, or 3 (the last one ragged)
def test_backward_matches_fp64(dtype, with_entropy_grad, chunk):
    hidden, weight, targets, grad_logprob, grad_entropy = _inputs(dtype)
    grad_entropy = grad_entropy if with_entropy_grad else None
    _, entropy, _, lse = tb.forward(hidden, weight, targets, None, 0.7, with_entropy_grad, -100)
    grad_hidden, grad_weight = tb.backward(hidden, weight, targets, lse, entropy, grad_logprob, grad_entropy,
                                           0.7, -100, chunk=chunk)
    ref_h, ref_w = reference_grads(hidden, weight, targets, grad_logprob, grad_entropy, 0.7)
    assert grad_hidden.dtype == dtype and grad_weight.dtype == dtype
    assert grad_hidden.shape == hidden.shape and grad_weight.shape == weight.shape
    assert_close(grad_hidden, ref_h, TOL[dtype], "grad_hidden")
    assert_close(grad_weight, ref_w, TOL[dtype], "grad_weight")
    assert bool((grad_hidden[targets == -100] == 0).all())  # ignored rows: no gradient at all


def test_backward_of_strided_views():
    # Non-contiguous hidden (a column slice) and weight (every other row of a bigger matrix); 70 tokens make
    # 3 token blocks, so the last group of the grouped grid is partial.
    g = torch.Generator().manual_seed(5)
    n = 70
    hidden = (torch.randn(n, D + 8, generator=g) * 2)[:, 4:4 + D]
    weight = (torch.randn(2 * V, D, generator=g) * 2 / D**0.5)[::2]
    targets = torch.randint(0, V, (n,), generator=g)
    grad_logprob, grad_entropy = torch.randn(n, generator=g), torch.randn(n, generator=g)
    _, entropy, _, lse = tb.forward(hidden, weight, targets, None, 1.0, True, -100)
    grad_hidden, grad_weight = tb.backward(hidden, weight, targets, lse, entropy, grad_logprob, grad_entropy,
                                           1.0, -100, chunk=TILE_V)
    ref_h, ref_w = reference_grads(hidden, weight, targets, grad_logprob, grad_entropy)
    assert_close(grad_hidden, ref_h, 1e-5, "grad_hidden")
    assert_close(grad_weight, ref_w, 1e-5, "grad_weight")


def test_backward_with_logits_of_magnitude_1e4():
    # Exact integer logits up to ±1e4 with a clear winner per row: p is one-hot up to exp(-20), log p of the
    # other columns reaches -2e4, and p·(log p + H) must come out 0, not NaN.
    g = torch.Generator().manual_seed(6)
    sign = torch.randint(0, 2, (D,), generator=g) * 2 - 1
    levels = torch.randperm(V, generator=g)[:, None] - V // 2  # distinct: logits of a row differ by >= D
    weight = levels * sign
    hidden = (torch.randint(0, 2, (N, 1), generator=g) * 2 - 1) * sign
    z = hidden.double() @ weight.double().T
    top2 = z.topk(2, dim=1).values
    assert float(z.abs().max()) > 4e3 and float((top2[:, 0] - top2[:, 1]).min()) > 20
    targets = torch.randint(0, V, (N,), generator=g)
    grad_logprob, grad_entropy = torch.randn(N, generator=g), torch.randn(N, generator=g)
    hidden, weight = hidden.float(), weight.float()
    _, entropy, _, lse = tb.forward(hidden, weight, targets, None, 1.0, True, -100)
    grad_hidden, grad_weight = tb.backward(hidden, weight, targets, lse, entropy, grad_logprob, grad_entropy,
                                           1.0, -100, chunk=TILE_V)
    ref_h, ref_w = reference_grads(hidden, weight, targets, grad_logprob, grad_entropy)
    assert bool(torch.isfinite(grad_hidden).all()) and bool(torch.isfinite(grad_weight).all())
    assert_close(grad_hidden, ref_h, 1e-5, "grad_hidden")
    assert_close(grad_weight, ref_w, 1e-5, "grad_weight")


def test_zero_tokens_give_zero_weight_grad():
    hidden, weight, targets, grad_logprob, _ = _inputs(torch.float32, n=0)
    empty = torch.zeros(0)
    grad_hidden, grad_weight = tb.backward(hidden, weight, targets, empty, None, grad_logprob, None, 1.0, -100)
    assert grad_hidden.shape == (0, D) and bool((grad_weight == 0).all())


def test_backward_rejects_entropy_grad_without_entropy():
    hidden, weight, targets, grad_logprob, grad_entropy = _inputs(torch.float32, n=4)
    with pytest.raises(ValueError, match="grad_entropy"):
        tb.backward(hidden, weight, targets, torch.zeros(4), None, grad_logprob, grad_entropy, 1.0, -100)
    with pytest.raises(ValueError, match="grad_logprob"):
        tb.backward(hidden, weight, targets, torch.zeros(4), None, grad_logprob[:3], None, 1.0, -100)
