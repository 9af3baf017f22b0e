"""The reference every LM-head number is judged against: cuBLAS bf16 GEMMs at the LM-head shapes, measured in the
same run as the kernels (benchmarks/gpu_check.sh runs it first).

    python3 benchmarks/gemm_reference.py OUT.json [--n 16384 --d 4096 --v 152064]

The three GEMMs of the loss at N tokens (docs/kernels.md): logits Z = h·Wᵀ ([N, d] x [d, V]), dW = Gᵀ·h
([V, N] x [N, d]) and dH = G·W ([N, V] x [V, d], K = V), each with a bf16 output and the fp32-output forms the
single pass uses (logits, dW accumulation), a device copy's bandwidth, and which fp32-output GEMM path this torch
takes (seedfast/ops/triton_backend.py, gemm_f32_mode). `gemm_tflops` (the logits GEMM's rate) is the rate
benchmarks/kernels.py --model --gemm-ref rates the kernels against. Without CUDA it writes the versions only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _ms(torch, fn, reps: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def measure(n: int, d: int, v: int) -> dict:
    import torch
    import triton

    from seedfast.ops import triton_backend as tb

    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
           "shape": {"N": n, "d": d, "V": v}}
    if not torch.cuda.is_available():
        out["gpu"] = None
        return out
    bf = dict(device="cuda", dtype=torch.bfloat16)
    h, w = torch.randn(n, d, **bf), torch.randn(v, d, **bf)
    g = torch.randn(n, v, **bf)
    flop = 2.0 * n * d * v
    rates = {}
    for name, fn in (("logits h.W^T", lambda: h @ w.T), ("dW G^T.h", lambda: g.T @ h),
                     ("dH G.W (K=V)", lambda: g @ w)):
        rates[name] = flop / _ms(torch, fn) / 1e9
    out["gpu"] = torch.cuda.get_device_name(0)
    out["gemm_f32_output_mode"] = tb.gemm_f32_mode(h.device)
    if out["gemm_f32_output_mode"] == "addmm":
        z = torch.empty(n, v, device="cuda", dtype=torch.float32)
        rates["logits h.W^T, fp32 out"] = flop / _ms(torch, lambda: torch.mm(h, w.T, out_dtype=torch.float32,
                                                                            out=z)) / 1e9
        acc = torch.zeros(v, d, device="cuda", dtype=torch.float32)
        rates["dW += G^T.h, fp32 C"] = flop / _ms(torch, lambda: torch.addmm(acc, g.T, h, out_dtype=torch.float32,
                                                                           out=acc)) / 1e9
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    out.update(gemm_tflops_by_shape=rates, gemm_tflops=rates["logits h.W^T"],
               gemm_tflops_min=min(rates[k] for k in ("logits h.W^T", "dW G^T.h", "dH G.W (K=V)")),
               copy_tbs=2 * 2**30 / (_ms(torch, lambda: dst.copy_(src)) / 1e3) / 1e12)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--v", type=int, default=152064)
    args = ap.parse_args(argv)
    result = measure(args.n, args.d, args.v)
    print(json.dumps(result), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
