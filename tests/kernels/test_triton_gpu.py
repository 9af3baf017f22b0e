"""Compiled Triton kernels on CUDA at realistic shapes (bf16) against fp64 references. Run by
benchmarks/gpu_check.sh; skipped without CUDA."""

import pytest
import torch

from tests.kernels.triton_reference import GPU, assert_close

pytestmark = GPU


def _case(n, d, vocab, dtype, seed=0, scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    hidden = (torch.randn(n, d, device="cuda", generator=g) * scale).to(dtype)
    weight = (torch.randn(vocab, d, device="cuda", generator=g) * 2 / d**0.5).to(dtype)
    targets = torch.randint(0, vocab, (n,), device="cuda", generator=g)
    targets[::97] = -100
    return hidden, weight, targets


def _reference(hidden, weight, targets, a, b, temperature=1.0, chunk=512, rows=None):
    """fp64 logprob, entropy, grad_hidden, grad_weight of Σ a·ℓ + Σ b·H, in token chunks (no N x V in fp64)."""
    w = weight.double()
    rows = torch.arange(hidden.shape[0], device=hidden.device) if rows is None else rows
    lp, ent, gh = [], [], []
    gw = torch.zeros_like(w)
    for start in range(0, rows.numel(), chunk):
        idx = rows[start:start + chunk]
        h, y = hidden[idx].double(), targets[idx]
        keep = y != -100
        logp = torch.log_softmax(h @ w.T / temperature, dim=-1)
        p = logp.exp()
        H = -(p * logp).sum(-1)
        onehot = torch.zeros_like(p)
        onehot[keep, y[keep]] = 1.0
        aa, bb = torch.where(keep, a[idx].double(), 0.0), torch.where(keep, b[idx].double(), 0.0)
        gz = (aa[:, None] * (onehot - p) - bb[:, None] * p * (logp + H[:, None])) / temperature
        lp.append(torch.where(keep, logp.gather(1, y.clamp(min=0)[:, None])[:, 0], 0.0))
        ent.append(torch.where(keep, H, 0.0))
        gh.append(gz @ w)
        gw += gz.T @ h
    return torch.cat(lp), torch.cat(ent), torch.cat(gh), gw


@pytest.mark.parametrize("n,d,vocab", [(4096, 3584, 152064), (1000, 4096, 128256)])
def test_bf16_realistic_shapes(n, d, vocab):
    from seedfast.ops import triton_backend as tb

    hidden, weight, targets = _case(n, d, vocab, torch.bfloat16)
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    logprob, entropy, _, lse = tb.forward(hidden, weight, targets, None, 1.0, True, -100)
    grad_h, grad_w = tb.backward(hidden, weight, targets, lse, entropy, a, b, 1.0, -100)
    ref_lp, ref_ent, ref_gh, ref_gw = _reference(hidden, weight, targets, a, b)
    assert_close(logprob, ref_lp, 1e-2, "logprob")
    assert_close(entropy, ref_ent, 1e-2, "entropy")
    assert_close(grad_h, ref_gh, 1e-2, "grad_hidden")
    assert_close(grad_w, ref_gw, 1e-2, "grad_weight")


def test_fp32_dual_context_temperature():
    from seedfast.ops import triton_backend as tb

    hidden, weight, targets = _case(777, 1024, 32003, torch.float32, seed=1)
    teacher = torch.randn_like(hidden)
    a, b = torch.randn(777, device="cuda"), torch.randn(777, device="cuda")
    logprob, entropy, teacher_lp, lse = tb.forward(hidden, weight, targets, teacher, 0.7, True, -100)
    grad_h, grad_w = tb.backward(hidden, weight, targets, lse, entropy, a, b, 0.7, -100, chunk=4096)
    ref_lp, ref_ent, ref_gh, ref_gw = _reference(hidden, weight, targets, a, b, 0.7)
    ref_teacher = _reference(teacher, weight, targets, a, b, 0.7)[0]
    assert_close(logprob, ref_lp, 1e-5, "logprob")
    assert_close(entropy, ref_ent, 1e-5, "entropy")
    assert_close(teacher_lp, ref_teacher, 1e-5, "teacher_logprob")
    assert_close(grad_h, ref_gh, 1e-5, "grad_hidden")
    assert_close(grad_w, ref_gw, 1e-5, "grad_weight")


def test_backward_is_deterministic():
    from seedfast.ops import triton_backend as tb

    hidden, weight, targets = _case(2048, 2048, 50000, torch.bfloat16, seed=2)
    a = torch.randn(2048, device="cuda")
    _, _, _, lse = tb.forward(hidden, weight, targets, None, 1.0, False, -100)
    first = tb.backward(hidden, weight, targets, lse, None, a, None, 1.0, -100, chunk=8192)
    second = tb.backward(hidden, weight, targets, lse, None, a, None, 1.0, -100, chunk=8192)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_token_offsets_beyond_int32():
    # N·d = 2.5e9 > 2^31: row offsets, G offsets and the K loop of dW = Gᵀ·H must be 64-bit.
    from seedfast.ops import triton_backend as tb

    n, d, vocab = 600_000, 4096, 1000
    hidden, weight, targets = _case(n, d, vocab, torch.bfloat16, seed=3)
    a = torch.randn(n, device="cuda")
    logprob, _, _, lse = tb.forward(hidden, weight, targets, None, 1.0, False, -100)
    grad_h, grad_w = tb.backward(hidden, weight, targets, lse, None, a, None, 1.0, -100)
    tail = torch.arange(n - 3000, n, device="cuda")  # rows whose offsets pass 2^31
    ref_lp, _, ref_gh, _ = _reference(hidden, weight, targets, a, torch.zeros_like(a), rows=tail)
    assert_close(logprob[tail], ref_lp, 1e-2, "logprob (tail rows)")
    assert_close(grad_h[tail], ref_gh, 1e-2, "grad_hidden (tail rows)")
    del grad_h
    ref_gw = _reference(hidden, weight, targets, a, torch.zeros_like(a), chunk=8192)[3]
    assert_close(grad_w, ref_gw, 1e-2, "grad_weight")


def test_public_ops_match_torch_backend():
    from seedfast.ops import LossOptions, fused_loss, linear_logprob
    from seedfast.ops import triton_backend as tb

    hidden, weight, targets = _case(3000, 2048, 64007, torch.bfloat16, seed=4)
    teacher = torch.randn_like(hidden)
    outs, grads = {}, {}
    for backend in ("torch", "triton"):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        out = linear_logprob(h, w, targets, teacher_hidden=teacher, with_entropy=True, backend=backend)
        (out.logprob.sum() + 0.1 * out.entropy.sum()).backward()
        outs[backend], grads[backend] = out, (h.grad.double(), w.grad.double())
    for field in ("logprob", "entropy", "teacher_logprob"):
        assert_close(getattr(outs["triton"], field), getattr(outs["torch"], field).double(), 1e-2, field)
    assert_close(grads["triton"][0], grads["torch"][0], 1e-2, "grad_hidden")
    assert_close(grads["triton"][1], grads["torch"][1], 1e-2, "grad_weight")

    g = torch.Generator(device="cuda").manual_seed(5)
    n = hidden.shape[0]
    lp = outs["torch"].logprob.detach()
    per_token = dict(token_weights=torch.full((n,), 1.0 / n, device="cuda"),
                     advantages=torch.randn(n, device="cuda", generator=g),
                     old_logprob=lp + 0.1 * torch.randn(n, device="cuda", generator=g),
                     ref_logprob=lp + 0.1 * torch.randn(n, device="cuda", generator=g),
                     teacher_logprob=outs["torch"].teacher_logprob)
    results = {}
    tb.reset_path_counts()
    for backend in ("torch", "triton"):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        loss, metrics = fused_loss(h, w, targets, **per_token, backend=backend, options=LossOptions(
            kl_coef=0.01, entropy_coef=0.001, opd_coef=0.01, gate="soft_or"))
        loss.backward()
        results[backend] = (loss.double(), metrics, h.grad.double(), w.grad.double())
    assert_close(results["triton"][0], results["torch"][0], 1e-3, "fused loss")
    assert_close(results["triton"][2], results["torch"][2], 1e-2, "fused grad_hidden")
    assert_close(results["triton"][3], results["torch"][3], 1e-2, "fused grad_weight")
    assert set(results["triton"][1]) == set(results["torch"][1])
    assert tb.fused_path_taken(tb.path_counts()) == "single_pass", tb.path_counts()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_single_pass_in_row_blocks(monkeypatch, dtype):
    # fused_loss's single pass (docs/kernels.md) at a realistic shape in 3 row blocks (dW accumulates in fp32),
    # per-token-mean weights (fp16: G ~ 1/(N·V) needs the scale). On-policy GRPO with an entropy bonus has
    # a_t = -A_t·w_t and b_t = -c·w_t exactly, so the fp64 reference needs no loss code.
    from seedfast.ops import LossOptions
    from seedfast.ops import triton_backend as tb

    n, d, vocab, coef = 3000, 3584, 152064, 0.01
    monkeypatch.setenv("SEEDFAST_TRITON_FUSED_MB", str(1024 * vocab * 6 / 2**20))
    assert tb.choose_fused_rows(n, vocab, 2) == 1024
    hidden, weight, targets = _case(n, d, vocab, dtype, seed=7)
    g = torch.Generator(device="cuda").manual_seed(8)
    adv = torch.randn(n, device="cuda", generator=g)
    w = torch.where(targets == -100, 0.0, 1.0 / n)
    per_token = dict(old_logprob=None, ref_logprob=None, teacher_logprob=None, teacher_mask=None, advantages=adv,
                     token_weights=w)
    options = LossOptions(clip_low=0.2, clip_high=0.2, dual_clip=None, kl_coef=0.0, kl_kind="k3", entropy_coef=coef,
                          opd_coef=0.0, opd_beta=5.0, gate="gap")
    tb.reset_path_counts()
    loss, _, grad_h, grad_w, logprob = tb.fused_forward_backward(
        hidden, weight, targets, temperature=1.0, ignore_index=-100, with_entropy=True, per_token=per_token,
        options=options)
    # the single pass ran (its two-pass fallback would pass the checks below too, 10x slower), its fp32-output GEMMs
    # on cuBLAS's addmm: 3 blocks x (logits, dW accumulation)
    counts = tb.path_counts()
    assert tb.fused_path_taken(counts) == "single_pass", counts
    assert counts.get("gemm_f32.addmm") == 6 and "gemm_f32.fp32_copies" not in counts, counts
    ref_lp, ref_ent, ref_gh, ref_gw = _reference(hidden, weight, targets, -adv * w, -coef * w)
    ref_loss = (w.double() * (-adv.double() - coef * ref_ent)).sum()
    assert_close(loss, ref_loss, 1e-3, "loss")
    assert_close(logprob, ref_lp, 1e-2, "logprob")
    for got, ref, what in ((grad_h, ref_gh, "grad_hidden"), (grad_w, ref_gw, "grad_weight")):
        norm = 1 / float(ref.abs().max())  # per-token-mean gradients are small: compare relative to their max
        assert_close(got.double() * norm, ref * norm, 2e-2, what)
