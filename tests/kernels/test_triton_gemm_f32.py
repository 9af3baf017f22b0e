"""The fp32-output GEMM of the backward (triton_backend._gemm_f32_out): out (+)= alpha·(a @ b) for bf16 a, b and an
fp32 out. Whether torch has addmm(..., out_dtype=float32) is probed once per device type (gemm_f32_mode); without
it the fp32-copy fallback must give the same numbers (against fp64), and with it the hot path catches nothing: an
error surfaces instead of switching the process to the slow path for good. On CUDA (gpu marker) the image's torch
must have the fp32-output addmm: without it the single pass silently never runs."""

import pytest
import torch

from seedfast.ops import triton_backend as tb
from tests.kernels.triton_reference import GPU, assert_close


def _case(device):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(37, 50, generator=g).to(torch.bfloat16).to(device)
    b = torch.randn(50, 24, generator=g).to(torch.bfloat16).to(device)
    start = torch.randn(37, 24, generator=g).to(device)
    return a, b, start


# torch 2.11 (the GPU image's) takes an fp32 C beside bf16/fp16 matrices in addmm's out_dtype form: its
# libtorch_cuda checks "self dtype must match either out_dtype or mat1 dtype" (the pre-flight,
# benchmarks/preflight_image_versions.sh, reads the string out of the image's wheel); older releases required self
# to have mat2's dtype, and the probe then says "none".
ADDMM_F32_SINCE = (2, 11)


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=GPU)])
@pytest.mark.parametrize("mode", ["addmm", "none"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_fp32_output_gemm_and_its_fallback(monkeypatch, device, mode, accumulate):
    if mode == "addmm" and tb.gemm_f32_mode(device) != "addmm":
        if device == "cuda" and _torch_version() >= ADDMM_F32_SINCE:
            pytest.fail(f"torch {torch.__version__} should have the fp32-output addmm on CUDA; the probe says none")
        pytest.skip(f"torch {torch.__version__} has no fp32-output addmm on {device}")
    monkeypatch.setitem(tb._GEMM_F32, torch.device(device).type, mode)
    monkeypatch.setattr(tb, "_FALLBACK_SLICE_BYTES", 3 * 24 * 4)  # 3 rows per slice: 37 rows -> 13 slices
    a, b, start = _case(device)
    out = start.clone()
    before = tb.path_counts()
    tb._gemm_f32_out(a.t().contiguous().t(), b, out, accumulate, 0.25)  # a column-major view, as G^T is
    expected = 0.25 * (a.double() @ b.double()) + (start.double() if accumulate else 0.0)
    assert_close(out, expected, 1e-6, "out")
    key = "gemm_f32.addmm" if mode == "addmm" else "gemm_f32.fp32_copies"
    assert tb.path_counts().get(key, 0) == before.get(key, 0) + 1  # the path it took is recorded


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_image_torch_has_the_fp32_output_addmm_on_cuda():
    # The single pass (fused_loss) runs only with it; the two-pass fallback passes every other test, 10x slower.
    if _torch_version() < ADDMM_F32_SINCE:
        pytest.skip(f"torch {torch.__version__} predates the fp32 C of addmm's out_dtype form")
    tb._GEMM_F32.pop("cuda", None)  # probe afresh on this device
    assert tb.gemm_f32_mode("cuda") == "addmm"
    a, b, start = _case("cuda")
    out = start.clone()
    torch.addmm(out, a, b, beta=1.0, alpha=1.0, out_dtype=torch.float32, out=out)  # what the single pass runs
    assert_close(out, a.double() @ b.double() + start.double(), 1e-6, "fp32 C += bf16 x bf16")


def test_probe_is_cached_and_the_hot_path_does_not_swallow_errors(monkeypatch):
    monkeypatch.setattr(tb, "_GEMM_F32", {})
    calls = []
    real_addmm = torch.addmm

    def broken_addmm(*args, **kwargs):
        calls.append(kwargs.get("out_dtype"))
        raise RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED")  # a real failure, not a missing feature

    assert tb.gemm_f32_mode("cpu") == tb.gemm_f32_mode("cpu")  # probed once: a second call does not run addmm
    monkeypatch.setattr(torch, "addmm", broken_addmm)
    assert tb.gemm_f32_mode("cpu") in ("addmm", "none") and calls == []
    tb._GEMM_F32["cpu"] = "addmm"
    a, b, start = _case("cpu")
    with pytest.raises(RuntimeError, match="CUBLAS_STATUS_EXECUTION_FAILED"):
        tb._gemm_f32_out(a, b, start.clone(), True, 1.0)
    assert tb._GEMM_F32["cpu"] == "addmm"  # not switched to the fallback for the rest of the process
    monkeypatch.setattr(torch, "addmm", real_addmm)


def test_probe_on_a_torch_without_out_dtype(monkeypatch):
    monkeypatch.setattr(tb, "_GEMM_F32", {})

    def old_addmm(*args, out_dtype=None, **kwargs):
        if out_dtype is not None:
            raise TypeError("addmm() got an unexpected keyword argument 'out_dtype'")
        return torch.ops.aten.addmm(*args, **kwargs)

    monkeypatch.setattr(torch, "addmm", old_addmm)
    assert tb.gemm_f32_mode("cpu") == "none"
