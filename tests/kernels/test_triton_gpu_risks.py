"""Risks that reproduce only on CUDA (skipped elsewhere; benchmarks/gpu_check.sh runs them):
- the 16-bit dH GEMM with K = V must accumulate in fp32, not reduce split-K partial sums in bf16;
- the single pass's memory peak at a real shape stays within its budget (logits freed before the dW cast);
- the fused single pass must not be taken where torch has no fp32-output addmm (it would fail), and its result
  there equals the two-pass path's."""

import pytest
import torch

from seedfast.ops import LossOptions
from seedfast.ops import triton_backend as tb
from tests.kernels.triton_reference import GPU

pytestmark = GPU


def test_dh_gemm_with_k_equal_v_accumulates_in_fp32():
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True  # torch's default: cuBLAS may split K
    g = torch.Generator(device="cuda").manual_seed(0)
    n, vocab, d = 256, 152064, 512
    grad = (torch.randn(n, vocab, device="cuda", generator=g) * 1e-3).to(torch.bfloat16)
    weight = torch.randn(vocab, d, device="cuda", generator=g).to(torch.bfloat16)
    out = torch.empty(n, d, device="cuda", dtype=torch.bfloat16)
    tb._matmul(grad, weight, out, False, 1.0, "matmul_dh")
    exact = (grad.double() @ weight.double())
    rounded_once = exact.to(torch.bfloat16).double()  # the best a bf16 output can be
    err = (out.double() - exact).abs().max() / exact.abs().max()
    best = (rounded_once - exact).abs().max() / exact.abs().max()
    assert err <= 2 * best + 1e-6, f"dH relative error {err:.2e}, one rounding gives {best:.2e}"
    assert torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction  # restored after the GEMM


def test_single_pass_peak_memory_within_its_budget():
    n, d, vocab = 4096, 2048, 152064
    g = torch.Generator(device="cuda").manual_seed(1)
    hidden = (torch.randn(n, d, device="cuda", generator=g) / d**0.5).to(torch.bfloat16)
    weight = torch.randn(vocab, d, device="cuda", generator=g).to(torch.bfloat16)
    targets = torch.randint(0, vocab, (n,), device="cuda", generator=g)
    rows = 1024  # four blocks: the fp32 dW accumulator and its cast exist
    per_token = dict(old_logprob=None, ref_logprob=None, teacher_logprob=None, teacher_mask=None,
                     advantages=torch.randn(n, device="cuda", generator=g),
                     token_weights=torch.full((n,), 1.0 / n, device="cuda"))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = tb.fused_forward_backward(hidden, weight, targets, temperature=1.0, ignore_index=-100,
                                    with_entropy=False, per_token=per_token, options=LossOptions(),
                                    rows=rows)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    block = rows * vocab * (4 + 2)  # fp32 logits + bf16 G
    dw32, dw16, dh = vocab * d * 4, vocab * d * 2, n * d * 2
    loop_peak = block + dw32 + dh
    cast_peak = dw32 + dw16 + dh
    slack = 128 << 20  # [N] vectors, the zeroed h block, cuBLAS workspace, allocator rounding
    assert peak <= max(loop_peak, cast_peak) + slack, (peak / 2**30, loop_peak / 2**30, cast_peak / 2**30)
    assert bool(torch.isfinite(out[3].float()).all())


def test_no_fp32_output_gemm_takes_the_two_pass_path(monkeypatch):
    g = torch.Generator(device="cuda").manual_seed(2)
    n, d, vocab = 512, 256, 4099
    hidden = torch.randn(n, d, device="cuda", generator=g).to(torch.bfloat16)
    weight = (torch.randn(vocab, d, device="cuda", generator=g) / d**0.5).to(torch.bfloat16)
    targets = torch.randint(0, vocab, (n,), device="cuda", generator=g)
    per_token = dict(old_logprob=None, ref_logprob=None, teacher_logprob=None, teacher_mask=None,
                     advantages=torch.randn(n, device="cuda", generator=g),
                     token_weights=torch.full((n,), 1.0 / n, device="cuda"))
    kw = dict(temperature=1.0, ignore_index=-100, with_entropy=False, per_token=per_token, options=LossOptions())
    two_pass = tb.fused_forward_backward(hidden, weight, targets, rows=0, **kw)
    monkeypatch.setitem(tb._GEMM_F32, "cuda", "none")
    monkeypatch.setattr(tb, "_fused", lambda *a, **k: pytest.fail("the single pass needs out_dtype"))
    monkeypatch.setattr(tb, "_WARNED", set())
    tb.reset_path_counts()
    with pytest.warns(RuntimeWarning, match="no fp32-output addmm"):  # loud, and counted
        got = tb.fused_forward_backward(hidden, weight, targets, **kw)
    counts = tb.path_counts()
    assert tb.fused_path_taken(counts) == "two_pass:no_fp32_gemm" and counts.get("gemm_f32.fp32_copies", 0) > 0
    for x, y in zip(got[2:4], two_pass[2:4]):
        torch.testing.assert_close(x.float(), y.float(), rtol=2e-2, atol=1e-6)
