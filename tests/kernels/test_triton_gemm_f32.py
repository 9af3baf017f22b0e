"""The fp32-output GEMM of the backward (triton_backend._gemm_f32_out): out (+)= alpha·(a @ b) for bf16 a, b and an
fp32 out. Whether torch has addmm(..., out_dtype=float32) is probed once per device type (gemm_f32_mode); without
it the fp32-copy fallback must give the same numbers (against fp64), and with it the hot path catches nothing: an
error surfaces instead of switching the process to the slow path for good."""

import pytest
import torch
from triton_reference import assert_close

from seedfast.ops import triton_backend as tb


def _case(device):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(37, 50, generator=g).to(torch.bfloat16).to(device)
    b = torch.randn(50, 24, generator=g).to(torch.bfloat16).to(device)
    start = torch.randn(37, 24, generator=g).to(device)
    return a, b, start


@pytest.mark.parametrize("mode", ["addmm", "none"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_fp32_output_gemm_and_its_fallback(monkeypatch, mode, accumulate):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if mode == "addmm" and tb.gemm_f32_mode(device) != "addmm":
        pytest.skip(f"torch {torch.__version__} has no fp32-output addmm on {device}")
    monkeypatch.setitem(tb._GEMM_F32, torch.device(device).type, mode)
    monkeypatch.setattr(tb, "_FALLBACK_SLICE_BYTES", 3 * 24 * 4)  # 3 rows per slice: 37 rows -> 13 slices
    a, b, start = _case(device)
    out = start.clone()
    tb._gemm_f32_out(a.t().contiguous().t(), b, out, accumulate, 0.25)  # a column-major view, as G^T is
    expected = 0.25 * (a.double() @ b.double()) + (start.double() if accumulate else 0.0)
    assert_close(out, expected, 1e-6, "out")


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
