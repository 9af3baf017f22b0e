"""fp16 safety of the stored logits gradient (docs/kernels.md, "fp16"): with per-token-mean weights the entries of
G = a·(onehot - p)/T are ~1/(N·V); at N·V = 2^25 that is below fp16's smallest subnormal (6e-8), so G rounded to
fp16 would be zero almost everywhere and dW would lose every non-target row. The launchers scale G by a power of
two before rounding and divide it out in the GEMMs. Interpreter, with large tiles so that N·V = 2^25 runs in
seconds; the control with the scale forced to 1 shows that the test sees the underflow."""

import pytest
import torch

from seedfast.kernels import configs
from seedfast.ops import LossOptions
from seedfast.ops import triton_backend as tb
from tests.kernels.triton_reference import INTERPRETER, assert_close

pytestmark = INTERPRETER

N, D, V = 1024, 16, 32768  # N·V = 2^25: G ~ 3e-8 < 6e-8


@pytest.fixture(autouse=True)
def big_tiles(monkeypatch):
    monkeypatch.setitem(configs.INTERPRET_FWD, "BLOCK_N", 256)
    monkeypatch.setitem(configs.INTERPRET_FWD, "BLOCK_V", 4096)
    monkeypatch.setitem(configs.INTERPRET_FWD, "BLOCK_D", 16)
    monkeypatch.setattr(configs, "INTERPRET_GRAD_LOGITS",
                        {"BLOCK_N": 256, "BLOCK_V": 4096, "BLOCK_D": 16, "GROUP_N": 2})
    monkeypatch.setattr(configs, "INTERPRET_ROW_STATS", {"BLOCK_R": 256, "BLOCK_V": 4096})
    monkeypatch.setattr(configs, "INTERPRET_GRAD_FROM_LOGITS", {"BLOCK_R": 256, "BLOCK_V": 4096})
    monkeypatch.setattr(configs, "INTERPRET_TOKEN_LOSS_BLOCK", 1024)


def _case():
    g = torch.Generator().manual_seed(0)
    hidden = (torch.randn(N, D, generator=g) * 0.5).half()
    weight = (torch.randn(V, D, generator=g) * 0.5).half()  # logits of spread ~1: p ~ 1/V everywhere
    targets = torch.randint(0, V, (N,), generator=g)
    return hidden, weight, targets


def _reference_grads(hidden, weight, targets, a):
    """fp64 dL/dh, dL/dW of Σ a_t·ℓ_t, written out: G = a·(onehot - p)."""
    h, w = hidden.double(), weight.double()
    p = torch.softmax(h @ w.T, dim=1)
    grad = -a.double()[:, None] * p
    grad[torch.arange(N), targets] += a.double()
    return grad @ w, grad.T @ h


def _single_pass(hidden, weight, targets):
    per_token = dict(old_logprob=None, ref_logprob=None, teacher_logprob=None, teacher_mask=None,
                     advantages=-torch.ones(N), token_weights=torch.full((N,), 1.0 / N))
    options = LossOptions(clip_low=0.2, clip_high=0.2, dual_clip=None, kl_coef=0.0, kl_kind="k3", entropy_coef=0.0,
                          opd_coef=0.0, opd_beta=5.0, gate="gap")
    _, _, gh, gw, _ = tb.fused_forward_backward(hidden, weight, targets, temperature=1.0, ignore_index=-100,
                                                with_entropy=False, per_token=per_token, options=options,
                                                rows=512)  # 2 blocks: dW accumulates in fp32
    return gh, gw


def _two_pass(hidden, weight, targets):
    _, _, _, lse = tb.forward(hidden, weight, targets, None, 1.0, False, -100)
    # On-policy, advantage -1, per-token mean: a_t = ∂L/∂ℓ_t = w_t·A_t·(-1)·ρ = 1/N.
    return tb.backward(hidden, weight, targets, lse, None, torch.full((N,), 1.0 / N), None, 1.0, -100,
                       chunk=8192)


@pytest.mark.parametrize("path", [_single_pass, _two_pass])
def test_fp16_gradient_survives_per_token_mean_weights(path, monkeypatch):
    hidden, weight, targets = _case()
    ref_h, ref_w = _reference_grads(hidden, weight, targets, torch.full((N,), 1.0 / N))
    others = torch.ones(V, dtype=torch.bool)
    others[targets] = False  # vocabulary rows that are nobody's target: their gradient is -Σ_t a·p·h only
    assert float(ref_w[others].abs().max()) > 1e-6  # representable in fp16 (subnormals reach 6e-8)
    # Compared relative to each reference's largest entry (assert_close's scale is max(1, max|expected|)).
    norm_h, norm_w = 1 / float(ref_h.abs().max()), 1 / float(ref_w[others].abs().max())
    gh, gw = path(hidden, weight, targets)
    assert_close(gh * norm_h, ref_h * norm_h, 2e-2, "grad_hidden")
    assert_close(gw[others] * norm_w, ref_w[others] * norm_w, 2e-2, "grad_weight of non-target rows")

    # Control: without the scale, G underflows and the non-target rows of dW come out (nearly) zero.
    monkeypatch.setattr(tb, "_grad_scale", lambda *args: 1.0)
    _, gw_unscaled = path(hidden, weight, targets)
    with pytest.raises(AssertionError):
        assert_close(gw_unscaled[others] * norm_w, ref_w[others] * norm_w, 2e-2, "unscaled")
