"""The reference every LM-head number is judged against, and the figures the kernel model prices with, measured in the
same run as the kernels (benchmarks/gpu_check.sh runs it first): cuBLAS bf16 GEMMs at the model's own shapes, the
single pass's row passes, a device copy.

    python3 -m benchmarks.gemm_reference OUT.json [--n 16384 --d 4096 --v 152064]

Measured, each under the key the model (benchmarks/kernels.py, design_phases) prices a phase with:
    logits, dw, dh          the whole-shape GEMMs of the loss at N tokens: Z = h·Wᵀ, dW = Gᵀ·h, dH = G·W (K = V),
                            bf16 out; `logits` is `gemm_tflops`, the rate the kernels are rated against
    block_logits_f32        the single pass's per-block logits, R x d x V with fp32 output (R: choose_fused_rows)
    block_dh                its dH = G·W per block, R x V x d, bf16 out
    block_dw_f32c           its dW += Gᵀ·h per block, V x R x d, fp32 C read and written (beta = 1)
    chunk_dw, chunk_dh_f32c the two-pass backward per vocabulary chunk (choose_grad_chunk): dW[chunk] = Gᵀ·H bf16 out,
                            dH += G·W[chunk] into fp32 (beta = 1)
    row_stats_tbs, grad_from_logits_tbs   the single pass's Triton row kernels over an fp32 [R, V] block, as bytes
                            moved per second (one read of Z; a read of Z and a 16-bit write of G)
    copy_tbs                a device copy of 1 GiB (read + write)
and which fp32-output GEMM path this torch takes (gemm_f32_mode). The JSON is rewritten after each measurement (a
window cut short keeps what it has). Without CUDA it writes the versions, the shapes and the plan only.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


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


def shapes(n: int, d: int, v: int) -> dict:
    """(M, K, N) of each GEMM the model prices, with the single pass's rows R and the two-pass chunk."""
    from seedfast.ops.triton_backend import choose_fused_rows, choose_grad_chunk

    rows = choose_fused_rows(n, v, 2) or n
    chunk = min(choose_grad_chunk(n, v, 2), v)
    return {"N": n, "d": d, "V": v, "R": rows, "chunk": chunk,
            "gemms": {"logits": (n, d, v), "dw": (v, n, d), "dh": (n, v, d), "block_logits_f32": (rows, d, v),
                      "block_dh": (rows, v, d), "block_dw_f32c": (v, rows, d), "chunk_dw": (chunk, n, d),
                      "chunk_dh_f32c": (n, chunk, d)}}


def measure(n: int, d: int, v: int, save=lambda out: None) -> dict:
    import torch
    import triton

    from seedfast.ops import triton_backend as tb

    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
           "shape": shapes(n, d, v)}
    if not torch.cuda.is_available():
        out["gpu"] = None
        save(out)
        return out
    out.update(gpu=torch.cuda.get_device_name(0), gemm_f32_output_mode=tb.gemm_f32_mode("cuda"),
               gemm_tflops_by_shape={})
    rates = out["gemm_tflops_by_shape"]
    bf = dict(device="cuda", dtype=torch.bfloat16)
    f32 = dict(device="cuda", dtype=torch.float32)
    shp = out["shape"]
    rows, chunk = shp["R"], shp["chunk"]
    h, w = torch.randn(n, d, **bf), torch.randn(v, d, **bf)
    g = torch.randn(n, v, **bf)

    def rate(name: str, fn) -> None:
        m, k, nn = shp["gemms"][name]
        rates[name] = 2.0 * m * k * nn / _ms(torch, fn) / 1e9
        if name == "logits":
            out["gemm_tflops"] = rates[name]
        save(out)

    rate("logits", lambda: h @ w.T)
    rate("dw", lambda: g.T @ h)
    rate("dh", lambda: g @ w)
    out["gemm_tflops_min"] = min(rates[k] for k in ("logits", "dw", "dh"))
    f32_ok = out["gemm_f32_output_mode"] == "addmm"
    hb, gb = h[:rows], g[:rows]
    if f32_ok:
        z = torch.empty(rows, v, **f32)
        rate("block_logits_f32", lambda: torch.mm(hb, w.T, out_dtype=torch.float32, out=z))
    rate("block_dh", lambda: gb @ w)
    if f32_ok:
        acc = torch.zeros(v, d, **f32)
        rate("block_dw_f32c", lambda: torch.addmm(acc, gb.T, hb, out_dtype=torch.float32, out=acc))
        del acc
    gc = g[:, :chunk]
    rate("chunk_dw", lambda: gc.T @ h)
    if f32_ok:
        dh = torch.zeros(n, d, **f32)
        rate("chunk_dh_f32c", lambda: torch.addmm(dh, gc, w[:chunk], out_dtype=torch.float32, out=dh))
        del dh
    out.update(_row_passes(torch, rows, v))
    save(out)
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    out["copy_tbs"] = 2 * 2**30 / (_ms(torch, lambda: dst.copy_(src)) / 1e3) / 1e12
    save(out)
    return out


def row_pass_launchers(torch, rows: int, v: int, device: str = "cuda"):
    """(row_stats launch, grad_from_logits launch, their tensors) over a random fp32 [rows, V] block of logits, with
    the single pass's own configurations (on CPU under TRITON_INTERPRET=1 too: a test checks them against torch)."""
    from seedfast.kernels import configs
    from seedfast.kernels import fused_rows as kr

    cuda = device == "cuda"
    t = {"z": torch.randn(rows, v, device=device) * 3, "y": torch.randint(0, v, (rows,), device=device),
         **{k: torch.empty(rows, device=device) for k in ("lse", "logprob", "entropy")},
         "a": torch.randn(rows, device=device), "b": torch.randn(rows, device=device),
         "g": torch.empty(rows, v, device=device, dtype=torch.bfloat16)}
    st = configs.ROW_STATS if cuda else configs.INTERPRET_ROW_STATS
    gr = configs.GRAD_FROM_LOGITS if cuda else configs.INTERPRET_GRAD_FROM_LOGITS
    sw = {"num_warps": configs.ROW_STATS_NUM_WARPS} if cuda else {}
    gw = {"num_warps": configs.GRAD_FROM_LOGITS_NUM_WARPS} if cuda else {}

    def stats():
        kr.row_stats_kernel[(math.ceil(rows / st["BLOCK_R"]),)](
            t["z"], t["y"], t["lse"], t["logprob"], t["entropy"], rows, v, t["z"].stride(0), 1.0, -100,
            WITH_ENTROPY=True, **st, **sw)

    def grad():
        kr.grad_from_logits_kernel[(math.ceil(rows / gr["BLOCK_R"]) * math.ceil(v / gr["BLOCK_V"]),)](
            t["z"], t["y"], t["lse"], t["entropy"], t["a"], t["b"], t["g"], rows, v, t["z"].stride(0),
            t["g"].stride(0), 1.0, 1.0, -100, HAS_B=True, **gr, **gw)

    return stats, grad, t


def _row_passes(torch, rows: int, v: int) -> dict:
    """Bytes per second of the single pass's two Triton row kernels over an fp32 [rows, V] block of logits."""
    stats, grad, _ = row_pass_launchers(torch, rows, v)
    return {"row_stats_tbs": rows * v * 4 / (_ms(torch, stats) / 1e3) / 1e12,
            "grad_from_logits_tbs": rows * v * (4 + 2) / (_ms(torch, grad) / 1e3) / 1e12}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--v", type=int, default=152064)
    args = ap.parse_args(argv)
    path = Path(args.out)

    def save(result: dict) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(path)

    result = measure(args.n, args.d, args.v, save)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
