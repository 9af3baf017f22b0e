"""The fp32-output GEMM of the backward (triton_backend._gemm_f32_out): out (+)= alpha·(a @ b) for bf16 a, b and an
fp32 out. On CUDA torch's out_dtype addmm does it in one cuBLAS call; where torch refuses (here, on CPU, always),
the fallback slices the rows and must give the same numbers. Against fp64."""

import pytest
import torch
from triton_reference import assert_close

from seedfast.ops import triton_backend as tb


@pytest.mark.parametrize("accumulate", [False, True])
def test_fp32_output_gemm_and_its_fallback(monkeypatch, accumulate):
    monkeypatch.setitem(tb.GEMM_F32_MODE, "mode", "addmm")
    monkeypatch.setattr(tb, "_FALLBACK_SLICE_BYTES", 3 * 24 * 4)  # 3 rows per slice: 37 rows -> 13 slices
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    a = torch.randn(37, 50, generator=g).to(torch.bfloat16).to(device)
    b = torch.randn(50, 24, generator=g).to(torch.bfloat16).to(device)
    start = torch.randn(37, 24, generator=g).to(device)
    out = start.clone()
    tb._gemm_f32_out(a.t().contiguous().t(), b, out, accumulate, 0.25)  # a column-major view, as G^T is
    expected = 0.25 * (a.double() @ b.double()) + (start.double() if accumulate else 0.0)
    assert_close(out, expected, 1e-6, "out")
    if device == "cpu":
        assert tb.GEMM_F32_MODE["mode"] == "mm+add"
