"""varlen_attention against a materialized fp64 reference, per backend; bad inputs; GPU backends."""

import pytest
import torch

from seedfast.model import VarlenPlan, make_cu_seqlens, resolve_backend, varlen_attention
from seedfast.model.attention_flash import installed as flash_installed

CPU_BACKENDS = ["sdpa", "flex"]
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def reference_attention(q, k, v, lens_q, lens_k, scale=None):
    """Each sequence alone, fp64: scores, explicit bottom-right causal mask, softmax, weighted sum."""
    H, Hkv, hd = q.shape[1], k.shape[1], q.shape[2]
    scale = hd**-0.5 if scale is None else scale
    out, iq, ik = [], 0, 0
    for lq, lk in zip(lens_q, lens_k):
        qs = q[iq : iq + lq].double().transpose(0, 1)  # [H, lq, hd]
        ks = k[ik : ik + lk].double().transpose(0, 1).repeat_interleave(H // Hkv, 0)
        vs = v[ik : ik + lk].double().transpose(0, 1).repeat_interleave(H // Hkv, 0)
        scores = qs @ ks.transpose(1, 2) * scale
        i = torch.arange(lq)[:, None]
        j = torch.arange(lk)[None, :]
        scores = scores.masked_fill(j > i + (lk - lq), float("-inf"))
        out.append((scores.softmax(-1) @ vs).transpose(0, 1))
        iq, ik = iq + lq, ik + lk
    return torch.cat(out).to(q.dtype) if out else q.new_zeros(q.shape)


def make_qkv(lens_q, lens_k, H=4, Hkv=2, hd=8, dtype=torch.float32, device="cpu", grad=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), H, hd, generator=gen, dtype=dtype).to(device)
    k = torch.randn(sum(lens_k), Hkv, hd, generator=gen, dtype=dtype).to(device)
    v = torch.randn(sum(lens_k), Hkv, hd, generator=gen, dtype=dtype).to(device)
    if grad:
        q, k, v = (x.requires_grad_() for x in (q, k, v))
    cu_q, cu_k = make_cu_seqlens(lens_q, device), make_cu_seqlens(lens_k, device)
    return q, k, v, cu_q, cu_k


CASES = {
    "self-causal": ([5, 1, 12, 3], [5, 1, 12, 3]),
    "equal-lengths": ([6, 6], [6, 6]),
    "with-past": ([3, 4, 1, 2], [10, 4, 9, 2]),  # sequence 1 and 3 have no past
    "empty-sequences": ([0, 4, 0, 2], [3, 7, 0, 2]),  # no queries at all in sequences 0 and 2
    "decode-step": ([1, 1, 1], [9, 1, 30]),
}


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(backend, case):
    lens_q, lens_k = CASES[case]
    q, k, v, cu_q, cu_k = make_qkv(lens_q, lens_k)
    out = varlen_attention(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), backend=backend)
    torch.testing.assert_close(out, reference_attention(q, k, v, lens_q, lens_k), rtol=0, atol=2e-6)


def test_gradients_match_reference():
    backend = "sdpa"  # flex has no backward on CPU
    lens_q, lens_k = [3, 5, 0, 2], [7, 5, 4, 2]
    q, k, v, cu_q, cu_k = make_qkv(lens_q, lens_k, grad=True)
    weight = torch.randn(q.shape)
    (varlen_attention(q, k, v, cu_q, cu_k, backend=backend) * weight).sum().backward()
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    (reference_attention(q, k, v, lens_q, lens_k) * weight).sum().backward()
    for name, mine, ref in zip("qkv", grads, (q.grad, k.grad, v.grad)):
        assert torch.isfinite(mine).all(), name
        torch.testing.assert_close(mine, ref, rtol=0, atol=1e-5, msg=name)


def test_flex_on_cpu_refuses_backward_clearly():
    q, k, v, cu_q, cu_k = make_qkv([3], [3], grad=True)
    with pytest.raises(ValueError, match="'flex' has no backward on CPU"):
        varlen_attention(q, k, v, cu_q, cu_k, backend="flex")
    with torch.no_grad():
        varlen_attention(q, k, v, cu_q, cu_k, backend="flex")


def test_custom_scale_and_multi_query():
    lens = [4, 6]
    q, k, v, cu_q, cu_k = make_qkv(lens, lens, H=4, Hkv=1)
    out = varlen_attention(q, k, v, cu_q, cu_k, backend="sdpa", scale=0.3)
    torch.testing.assert_close(out, reference_attention(q, k, v, lens, lens, scale=0.3), rtol=0, atol=2e-6)


def test_plan_is_reusable_across_layers():
    lens_q, lens_k = [2, 5], [6, 5]
    plan = VarlenPlan(make_cu_seqlens(lens_q), make_cu_seqlens(lens_k), backend="sdpa")
    for seed in range(2):
        q, k, v, _, _ = make_qkv(lens_q, lens_k, seed=seed)
        torch.testing.assert_close(plan(q, k, v), reference_attention(q, k, v, lens_q, lens_k), rtol=0, atol=2e-6)


def test_auto_is_sdpa_on_cpu():
    assert resolve_backend("auto", torch.device("cpu"), torch.float32) == "sdpa"


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda a: {**a, "backend": "xformers"}, "unknown attention backend 'xformers'"),
        (lambda a: {**a, "backend": "flash"}, "'flash' needs the flash-attn package"),
        (lambda a: {**a, "cu_q": a["cu_q"].long()}, "cu_q must be int32"),
        (lambda a: {**a, "cu_k": a["cu_k"][1:]}, "cu_k must start at 0"),
        (lambda a: {**a, "cu_q": torch.tensor([0, 5, 3, 8], dtype=torch.int32)}, "cu_q must be non-decreasing"),
        (lambda a: {**a, "cu_k": a["cu_k"][:-1]}, "same number of sequences"),
        (lambda a: {**a, "cu_q": torch.tensor([0, 5, 11], dtype=torch.int32)}, "sequence 1 has 6 queries but only 5"),
        (lambda a: {**a, "q": a["q"][:-1]}, "q has 9 tokens but cu_q ends at 10"),
        (lambda a: {**a, "k": a["k"][:, :, :4], "v": a["v"][:, :, :4]}, "q head_dim 8 != k head_dim 4"),
        (lambda a: {**a, "q": a["q"][:, :3]}, "multiple of k/v heads"),
        (lambda a: {**a, "v": a["v"].double()}, "must share a dtype"),
        (lambda a: {**a, "q": a["q"][0]}, "q must be a 3-D tensor"),
        (lambda a: {**a, "max_q": 7}, "max_q=7 but the longest query sequence has 5"),
    ],
)
def test_bad_input_gets_one_clear_error(mutate, match):
    q, k, v, cu_q, cu_k = make_qkv([5, 5], [5, 5])
    args = mutate({"q": q, "k": k, "v": v, "cu_q": cu_q, "cu_k": cu_k, "backend": "sdpa"})
    with pytest.raises(ValueError, match=match):
        varlen_attention(**args)


@gpu
@needs_cuda
@pytest.mark.parametrize("backend", ["sdpa", "flex"] + (["flash"] if flash_installed() else []))
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_backends_match_reference(backend, case):
    lens_q, lens_k = CASES[case]
    q, k, v, cu_q, cu_k = make_qkv(lens_q, lens_k, H=8, Hkv=2, hd=64, dtype=torch.bfloat16, device="cuda")
    out = varlen_attention(q, k, v, cu_q, cu_k, backend=backend)
    ref = reference_attention(q.cpu(), k.cpu(), v.cpu(), lens_q, lens_k)
    torch.testing.assert_close(out.cpu().float(), ref.float(), rtol=0.02, atol=0.02)


@gpu
@needs_cuda
def test_auto_prefers_flash_then_flex_on_cuda():
    expected = "flash" if flash_installed() else "flex"
    assert resolve_backend("auto", torch.device("cuda"), torch.bfloat16) == expected
    assert resolve_backend("auto", torch.device("cuda"), torch.float32) == "flex"
