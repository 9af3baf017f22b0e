"""GPU microbenchmark of the fused linear log-prob kernels (bf16) against materialized logits and peers, with a
performance model (docs/kernels.md, "Performance model").

    python -m benchmarks.kernels            # N in {4096, 16384, 32768} x (d, V) in {(3584, 152064), (4096, 128256)}
    python -m benchmarks.kernels --quick    # N in {4096, 16384}, (3584, 152064) only
    python -m benchmarks.kernels --model    # no GPU: the model's H200 prediction -> results/kernel_model.json

The model counts, per design and phase, the executed FLOPs (the useful 2·N·V·d forward / 6·N·V·d forward +
backward, plus recomputed logits) and the HBM bytes, and predicts the time as a roofline: a phase takes
max(FLOPs / (GEMM rate x kernel efficiency), overlapped bytes / bandwidth) + exposed bytes / bandwidth, phases in
sequence. On a GPU the GEMM rate is the cuBLAS GEMM of the logits shape measured in the same run and the
bandwidth a measured device copy; each measured row gets its predicted time beside it.

Variants: ours (single context), ours dual (teacher rows on the same W tiles, forward only: the teacher takes
no gradient), PyTorch eager with materialized logits, torch.compile of the same, Liger-Kernel's fused linear
cross entropy when installed, and a cuBLAS bf16 GEMM of the logits shape as the roofline. Times are medians
of CUDA-event timings; memory is the peak allocated above the inputs (outputs included, listed apart).
TFLOP/s count the model FLOPs: 2·N·V·d forward, 6·N·V·d forward + backward (what a linear layer needs);
executed_tflop counts what the design runs (the two-pass backward of linear_logprob recomputes the logits: 8·N·V·d;
fused_loss's single pass: 6·N·V·d). Writes results/kernels.json and a PNG.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path

from benchmarks.common import RESULTS_DIR, print_table, time_reps, versions, write_json_atomic, write_results

# ----------------------------------------------------------------------------------------- performance model

# Every time is rated against cuBLAS bf16 GEMMs measured on the device in the same run (benchmarks/gemm_reference.py, at
# the model's own shapes: whole, per row block, per vocabulary chunk, with their fp32 outputs), never a datasheet: no
# design built from cuBLAS GEMMs can beat them. Without a GPU (--model) each input is stated with its source (INPUTS).
ASSUMED_DEVICE = {"name": "H200 (the lending workplace's measurements, not this project's run)",
                  "gemm_tflops_range": [769.0, 798.0], "hbm_tbs": 4.3, "sms": 132,
                  "source": "the workplace's notes on its lent nvidia-h200 machine (2026-10-28 and 2026-11-04): an "
                            "8192x8192x8192 bf16 matrix product through PyTorch at 769-798 TFLOP/s on random data, a "
                            "device-to-device copy at ~4.3 TB/s, 132 SMs; an 8192^3 GEMM, not the model's shapes: a "
                            "GPU run replaces them with its own benchmarks/gemm_reference.py numbers (--gemm-ref)"}
# Triton GEMM-like kernels (forward, recomputed logits gradient) relative to the measured cuBLAS rate: assumptions
# until a GPU run measures them. 0.6 is where verl's Triton LM-head kernel sits (~470 of ~790 TFLOP/s, Liger-Kernel
# PR 1422); 0.7 the upper end for our 128x256 wgmma tile at 255 registers, one CTA per SM and no TMA (issue 35).
TRITON_EFF = 0.7
TRITON_EFFS = (0.6, 0.7)
INPUTS = {
    "gemm_tflops": {"value": ASSUMED_DEVICE["gemm_tflops_range"], "source": ASSUMED_DEVICE["source"]},
    "hbm_tbs": {"value": ASSUMED_DEVICE["hbm_tbs"], "source": "the same notes: a device-to-device copy through "
                                                              "PyTorch, bytes read + written"},
    "sms": {"value": ASSUMED_DEVICE["sms"], "source": "the same notes: PyTorch's multi_processor_count"},
    "triton_eff": {"value": list(TRITON_EFFS), "source": "assumption: 0.6 = verl's Triton forward (~470 of ~790 "
                                                         "TFLOP/s, Liger-Kernel PR 1422); 0.7 the upper end for a "
                                                         "255-register tile, one CTA per SM, no TMA"},
    "per_block_and_chunk_gemms": {"value": "the whole-shape rate, their fp32 bytes beyond a bf16 output exposed at "
                                           "copy bandwidth",
                                  "source": "assumption until benchmarks/gemm_reference.py measures block_logits_f32, "
                                            "block_dh, block_dw_f32c (K = R = 2048, beta = 1), chunk_dw, "
                                            "chunk_dh_f32c; with --gemm-ref each such phase takes its measured rate"},
    "row_passes": {"value": "copy bandwidth", "source": "assumption until benchmarks/gemm_reference.py measures "
                                                        "row_stats_tbs and grad_from_logits_tbs"},
}
# Public reference points at N = 16384-ish, H200, TP1 (Liger-Kernel PR 1422): TFLOP/s of the LM-head loss.
REFERENCE_POINTS = {"liger_cute_fwd_tflops": 790.0, "liger_cute_bwd_tflops": 768.0, "verl_triton_fwd_tflops": 470.0,
                    "source": "Liger-Kernel PR 1422: hand-written CuTe kernels (persistent, TMA, warp-specialized, "
                              "logits never in HBM) vs verl's Triton implementation, H200, TP1"}


def _phase(name: str, engine: str, flops: float = 0.0, overlapped: float = 0.0, exposed: float = 0.0,
           measured_as: str | None = None) -> dict:
    """One phase; `measured_as` names the benchmarks/gemm_reference.py figure that prices it when measured (a GEMM
    rate in gemm_tflops_by_shape, or a row pass's bytes per second)."""
    return {"phase": name, "engine": engine, "flops": flops, "bytes_overlapped": overlapped, "bytes_exposed": exposed,
            "measured_as": measured_as}


def _fwd_phases(n: int, d: int, vocab: int, e: int, sms: int, before: bool) -> list[dict]:
    """The Triton forward: 2NVd; W read once per token-block group, h once per vocabulary split."""
    from seedfast.ops.triton_backend import wave_splits

    blocks = math.ceil(n / 128)
    if before:  # c2db20d: splits = max(8, ceil(4·SMs / blocks)), groups of ceil(SMs / splits) token blocks
        splits = max(1, min(max(8, math.ceil(4 * sms / blocks)), math.ceil(vocab / 256), 256))
        group = max(1, math.ceil(sms / splits))
    else:
        splits = wave_splits(blocks, math.ceil(vocab / 256), sms)
        group = min(blocks, 16)
    w_reads = math.ceil(blocks / group)
    traffic = w_reads * vocab * d * e + splits * n * d * e + splits * n * 4 * 4 * 2
    programs = blocks * splits
    phase = _phase("fwd (Triton)", "triton", 2.0 * n * vocab * d, traffic)
    # A partial last wave idles SMs: the compute time divides by the wave efficiency.
    phase.update(splits=splits, group=group, w_reads=w_reads, waves=programs / sms,
                 wave_eff=programs / (math.ceil(programs / sms) * sms))
    return [phase, _phase("merge splits", "memory", exposed=splits * n * 16 + n * 16)]


def design_phases(design: str, n: int, d: int, vocab: int, sms: int = 132, e: int = 2) -> list[dict]:
    """Phases of one design at one shape (bf16: e = 2 bytes). A cuBLAS phase runs at the measured GEMM rate, which
    already includes reading its 16-bit operands and writing a 16-bit output (overlapped); what it moves beyond that
    (an fp32 output's other 2 bytes, an fp32 C read back) is exposed. Designs:
    before_fwd / after_fwd          linear_logprob forward (Triton)
    before_fwd_bwd                  c2db20d: forward + Triton recompute of G (2048-column chunks at N=16k) + Triton
                                    GEMMs dW, dH; the fp32 dH read-modify-write is a separate epilogue pass
    after_two_pass_fwd_bwd          linear_logprob now: forward + Triton recompute of G (256 MiB chunks) + cuBLAS dW,
                                    dH (fp32 dH accumulated: its read-modify-write beyond a bf16 output exposed)
    after_single_pass_fwd_bwd       fused_loss now: per row block, cuBLAS logits (fp32 out) + row kernels + cuBLAS dH,
                                    dW (fp32 accumulator read-modify-write per block, the cast at the end)
    """
    gemm = 2.0 * n * vocab * d
    if design in ("before_fwd", "after_fwd"):
        return _fwd_phases(n, d, vocab, e, sms, before=design == "before_fwd")
    if design in ("before_fwd_bwd", "after_two_pass_fwd_bwd"):
        before = design == "before_fwd_bwd"
        budget = (64 if before else 256) * 2**20
        chunk = max(256, min(int(budget // (n * e)) // 256 * 256, math.ceil(vocab / 256) * 256))
        chunks = math.ceil(vocab / chunk)
        dh_rmw = n * d * 4 * (2 * chunks - 1)  # first chunk writes, the others read and write fp32 dH
        dh_extra = chunks * n * d * (4 - e) + (chunks - 1) * n * d * 4  # beyond a bf16 output, per chunk
        g = n * vocab * e
        phases = _fwd_phases(n, d, vocab, e, sms, before)
        phases.append(_phase("token loss", "memory", exposed=n * 4 * 12))
        if not before:
            phases.append(_phase("h with ignored rows zeroed (dW operand)", "memory", exposed=2 * n * d * e))
        phases.append(_phase("G = recomputed logits gradient (Triton)", "triton", gemm,
                             overlapped=g + chunks * (n * d * e) + vocab * d * e))
        engine = "triton" if before else "cublas"
        phases.append(_phase("dW = G^T.H", engine, gemm, overlapped=g + chunks * n * d * e + vocab * d * e,
                             measured_as=None if before else "chunk_dw" if chunks > 1 else "dw"))
        phases.append(_phase("dH += G.W", engine, gemm, overlapped=g + vocab * d * e,
                             exposed=dh_rmw if before else dh_extra,
                             measured_as=None if before else "chunk_dh_f32c" if chunks > 1 else "dh"))
        phases[-1].update(chunk=chunk, chunks=chunks, dh_rmw_gb=dh_rmw / 1e9)
        if chunks > 1:
            phases.append(_phase("dH fp32 -> bf16", "memory", exposed=n * d * (4 + e)))
        return phases
    if design == "after_single_pass_fwd_bwd":
        from seedfast.ops.triton_backend import choose_fused_rows

        rows = choose_fused_rows(n, vocab, e) or n
        blocks = math.ceil(n / rows)
        z = rows * vocab
        dw_rmw = vocab * d * 4 * (2 * blocks - 1) if blocks > 1 else vocab * d * e
        dw_extra = blocks * vocab * d * (4 - e) + (blocks - 1) * vocab * d * 4 if blocks > 1 else 0
        per_block = [
            _phase("Z = h.W^T (cuBLAS, fp32 out)", "cublas", 2.0 * rows * vocab * d,
                   overlapped=rows * d * e + vocab * d * e + z * e, exposed=z * (4 - e),
                   measured_as="block_logits_f32"),
            _phase("row stats (Triton): read Z", "memory", exposed=z * 4, measured_as="row_stats_tbs"),
            _phase("G from Z (Triton): read Z, write G", "memory", exposed=z * (4 + e),
                   measured_as="grad_from_logits_tbs"),
            _phase("dH = G.W (cuBLAS)", "cublas", 2.0 * rows * vocab * d,
                   overlapped=z * e + vocab * d * e + rows * d * e, measured_as="block_dh"),
            _phase("h with ignored rows zeroed (dW operand)", "memory", exposed=2 * rows * d * e),
        ]
        phases = [{**p, "flops": p["flops"] * blocks, "bytes_overlapped": p["bytes_overlapped"] * blocks,
                   "bytes_exposed": p["bytes_exposed"] * blocks} for p in per_block]
        phases.append(_phase("dW += G^T.h (cuBLAS, fp32 C)", "cublas", gemm,
                             overlapped=blocks * (z * e + rows * d * e + vocab * d * e), exposed=dw_extra,
                             measured_as="block_dw_f32c" if blocks > 1 else "dw"))
        phases[-1].update(rows=rows, blocks=blocks, dw_rmw_gb=dw_rmw / 1e9)
        phases.append(_phase("token loss", "memory", exposed=n * 4 * 12))
        if blocks > 1:
            phases.append(_phase("dW fp32 -> bf16", "memory", exposed=vocab * d * (4 + e)))
        return phases
    raise ValueError(f"unknown design {design!r}")


def _divergence_pass(name: str, n: int, d: int, vocab: int, e: int, sms: int, partials: int) -> dict:
    """One Triton pass of the divergence kernels over V: student and teacher logits on each W tile (2 GEMMs' worth,
    4NVd), 128x64 tiles in vocabulary splits (the forward's grid); W read once per token-block group, both hidden
    matrices once per split, `partials` fp32 [splits, N] buffers written and read back."""
    from seedfast.ops.triton_backend import wave_splits

    blocks = math.ceil(n / 128)
    splits = wave_splits(blocks, math.ceil(vocab / 64), sms)
    group = min(blocks, 16)
    w_reads = math.ceil(blocks / group)
    programs = blocks * splits
    phase = _phase(name, "triton", 4.0 * n * vocab * d,
                   w_reads * vocab * d * e + splits * 2 * n * d * e + splits * n * 4 * partials * 2)
    phase.update(splits=splits, group=group, w_reads=w_reads, waves=programs / sms,
                 wave_eff=programs / (math.ceil(programs / sms) * sms))
    return phase


def divergence_phases(design: str, n: int, d: int, vocab: int, sms: int = 132, e: int = 2) -> list[dict]:
    """Phases of the divergence kernels (docs/kernels.md, "Divergence kernels"; designs div_<kind>_fwd and
    div_<kind>_fwd_bwd). Forward: reverse_kl / forward_kl one online pass (4NVd), jsd a pass for both lse and a pass
    for the sums (8NVd). Backward: per 256 MiB chunk of G, G recomputed from both contexts (Triton, 4NVd), then
    dW = Gᵀ·h and dH += G·W (cuBLAS, 2NVd each; dH accumulated in fp32 over the chunks)."""
    kind = design.removeprefix("div_").removesuffix("_fwd_bwd").removesuffix("_fwd")
    phases = [_divergence_pass("online lse + cross term (Triton, 2 contexts)" if kind != "jsd"
                               else "lse of both (Triton, 2 contexts)", n, d, vocab, e, sms, 5 if kind != "jsd" else 4),
              _phase("merge splits", "memory", exposed=n * 4 * 8)]
    if kind == "jsd":
        phases.append(_divergence_pass("sums with M (Triton, 2 contexts)", n, d, vocab, e, sms, 2))
    if not design.endswith("_fwd_bwd"):
        return phases
    budget = 256 * 2**20
    chunk = max(256, min(int(budget // (n * e)) // 256 * 256, math.ceil(vocab / 256) * 256))
    chunks = math.ceil(vocab / chunk)
    g = n * vocab * e
    phases.append(_phase("h with coef-0 rows zeroed (dW operand)", "memory", exposed=2 * n * d * e))
    phases.append(_phase("G = recomputed divergence gradient (Triton, 2 contexts)", "triton", 4.0 * n * vocab * d,
                         overlapped=g + chunks * 2 * n * d * e + vocab * d * e))
    phases.append(_phase("dW = G^T.h", "cublas", 2.0 * n * vocab * d,
                         overlapped=g + chunks * n * d * e + vocab * d * e,
                         measured_as="chunk_dw" if chunks > 1 else "dw"))
    dh_extra = chunks * n * d * (4 - e) + (chunks - 1) * n * d * 4 if chunks > 1 else 0
    phases.append(_phase("dH += G.W", "cublas", 2.0 * n * vocab * d, overlapped=g + vocab * d * e, exposed=dh_extra,
                         measured_as="chunk_dh_f32c" if chunks > 1 else "dh"))
    phases[-1].update(chunk=chunk, chunks=chunks)
    if chunks > 1:
        phases.append(_phase("dH fp32 -> bf16", "memory", exposed=n * d * (4 + e)))
    return phases


def useful_gemms(design: str) -> int:
    """GEMMs of useful work a design is rated against: the logits forward 1, forward + backward 3 (logits, dW, dH); a
    divergence needs two contexts' logits: forward 2, forward + backward 4 (jsd's second pass and every backward
    recompute are executed, not useful)."""
    if design.startswith("div_"):
        return 4 if design.endswith("_fwd_bwd") else 2
    return 1 if design.endswith("_fwd") else 3


def predict(design: str, n: int, d: int, vocab: int, gemm_tflops: float, hbm_tbs: float, sms: int = 132,
            triton_eff: float = TRITON_EFF, measured: dict | None = None) -> dict:
    """Roofline prediction of one design at a cuBLAS GEMM rate (measured, or stated with its source): executed and
    useful FLOPs, bytes, time and % of that rate. A phase takes max(FLOPs / (rate x efficiency), overlapped bytes /
    bandwidth) + exposed bytes / bandwidth with efficiency <= 1. `measured` (benchmarks/gemm_reference.py's JSON of
    the same run, at this shape) prices each phase it measured by its own figure instead: a cuBLAS phase takes its
    FLOPs at that GEMM's measured rate (its fp32 traffic is inside the measurement), a row pass its bytes at that
    kernel's measured bytes per second. So no phase is faster than the GEMMs it contains at the rate it is priced."""
    if not 0.0 < triton_eff <= 1.0:
        raise ValueError(f"triton_eff must be in (0, 1], got {triton_eff}")
    phases = (divergence_phases if design.startswith("div_") else design_phases)(design, n, d, vocab, sms)
    by_shape = (measured or {}).get("gemm_tflops_by_shape", {})
    total_ms = 0.0
    for p in phases:
        key = p.get("measured_as")
        rate = gemm_tflops * 1e12 * (triton_eff if p["engine"] == "triton" else 1.0) * p.get("wave_eff", 1.0)
        compute = p["flops"] / rate if p["flops"] else 0.0
        p["gemm_ms"] = 1e3 * p["flops"] / (gemm_tflops * 1e12)  # the same FLOPs as cuBLAS GEMMs: the floor
        bandwidth = hbm_tbs * 1e12
        if key in by_shape:
            p["ms"] = 1e3 * p["flops"] / (by_shape[key] * 1e12)
            p["priced_by"] = f"measured {key}"
        elif measured and measured.get(key):
            p["ms"] = 1e3 * p["bytes_exposed"] / (measured[key] * 1e12)
            p["priced_by"] = f"measured {key}"
        else:
            p["ms"] = 1e3 * (max(compute, p["bytes_overlapped"] / bandwidth) + p["bytes_exposed"] / bandwidth)
            p["priced_by"] = "model"
        total_ms += p["ms"]
    useful = 2.0 * n * vocab * d * useful_gemms(design)
    executed = sum(p["flops"] for p in phases)
    return {"design": design, "N": n, "d": d, "V": vocab, "gemm_tflops": gemm_tflops, "hbm_tbs": hbm_tbs,
            "useful_tflop": useful / 1e12, "executed_tflop": executed / 1e12,
            "hbm_gb": sum(p["bytes_overlapped"] + p["bytes_exposed"] for p in phases) / 1e9,
            "predicted_ms": total_ms, "gemm_ms_of_useful_work": 1e3 * useful / (gemm_tflops * 1e12),
            "predicted_pct_of_gemm": 100.0 * useful / (gemm_tflops * 1e12) / (total_ms / 1e3),
            "predicted_tflops": useful / (total_ms / 1e3) / 1e12, "triton_eff": triton_eff,
            "measured_phases": sum(p["priced_by"] != "model" for p in phases), "phases": phases}


DESIGNS = ("before_fwd", "after_fwd", "before_fwd_bwd", "after_two_pass_fwd_bwd", "after_single_pass_fwd_bwd")
MODEL_SHAPES = ((16384, 4096, 152064), (4096, 4096, 152064), (1024, 4096, 152064), (16384, 3584, 152064))
# The divergence kernels at Qwen2.5-0.5B's LM head (d = 896, V = 151936, a 4096-token micro-batch) and 7B's
# (d = 3584, V = 152064, 16384 tokens).
DIVERGENCE_DESIGNS = tuple(f"div_{kind}_{phase}" for kind in ("reverse_kl", "forward_kl", "jsd")
                           for phase in ("fwd", "fwd_bwd"))
DIVERGENCE_SHAPES = ((4096, 896, 151936), (16384, 3584, 152064))


def model_report(shapes=MODEL_SHAPES, gemm_ref: dict | None = None,
                 divergence_shapes=DIVERGENCE_SHAPES) -> dict:
    """Predictions at the cuBLAS rates of `gemm_ref` (benchmarks/gemm_reference.py's JSON, measured in the same run;
    its per-block and per-chunk GEMMs and row passes price the phases they measure at its shape) or, without one, at
    both ends of the stated range (ASSUMED_DEVICE, INPUTS), for each assumed Triton efficiency."""
    measured = bool(gemm_ref and gemm_ref.get("gemm_tflops"))
    if measured:
        device = {"name": gemm_ref.get("gpu"), "gemm_tflops_range": [gemm_ref["gemm_tflops"]] * 2,
                  "hbm_tbs": gemm_ref["copy_tbs"], "sms": 132,
                  "source": "measured in this run (benchmarks/gemm_reference.py): cuBLAS bf16 GEMMs at the model's "
                            "shapes, row passes, copy"}
        ref_shape = gemm_ref.get("shape", {})
    else:
        device = ASSUMED_DEVICE
    rows = []
    plan = [(shape, DESIGNS) for shape in shapes] + [(shape, DIVERGENCE_DESIGNS) for shape in divergence_shapes]
    for (n, d, vocab), designs in plan:
        same = measured and (ref_shape.get("N"), ref_shape.get("d"), ref_shape.get("V")) == (n, d, vocab)
        for gemm_tflops in sorted(set(device["gemm_tflops_range"])):
            for eff in TRITON_EFFS:
                for design in designs:
                    rows.append(predict(design, n, d, vocab, gemm_tflops, device["hbm_tbs"], device["sms"], eff,
                                        measured=gemm_ref if same else None))
    return {"device": device, "gemm_rate_measured": measured, "inputs": INPUTS if not measured else
            {"measured": "benchmarks/gemm_reference.py of this run", "triton_eff": INPUTS["triton_eff"]},
            "triton_eff_assumed": list(TRITON_EFFS), "reference_points": REFERENCE_POINTS, "prediction": True,
            "note": "a model prediction, not a measurement (docs/kernels.md); rated against the cuBLAS GEMM rate "
                    "named in device.source; every input figure with its source in `inputs`", "rows": rows}


# The prediction table of docs/kernels.md, 'Performance model and the H200 prediction': per row the design, the
# Triton efficiency it assumes (None: a design without Triton GEMM phases, the same at every efficiency), its name
# there ({dh_gb}: the GB its `dH +=` phase moves exposed), and whether the row is the headline (bold).
DOC_ROWS = (
    ("after_fwd", 0.7, "forward", False),
    ("after_fwd", 0.6, "forward", False),
    ("after_two_pass_fwd_bwd", 0.7, "`linear_logprob` forward + backward (two pass, cuBLAS `dW`/`dH`)", False),
    ("after_two_pass_fwd_bwd", 0.6, "the same", False),
    ("after_single_pass_fwd_bwd", None, "`fused_loss` forward + backward (single pass)", True),
    ("before_fwd_bwd", 0.7, "forward + backward before the rewrite (two pass, Triton GEMMs, {dh_gb} GB of dH)", False),
)


def _ms(x: float) -> str:
    return f"{x:.1f}" if x < 50 else f"{x:.0f}"  # tenths of a ms for the forward's tens, whole ms from 50 up


def prediction_table(report: dict, n: int = 16384, d: int = 4096) -> str:
    """The prediction table (DOC_ROWS) from results/kernel_model.json (make docs): each DOC_ROWS design at
    `n` x `d`, its predicted time and useful TFLOP/s over the report's two cuBLAS rates (low–high). "% of GEMM" is
    one figure, at the slower rate, where the rate moves it by under a quarter point (the design is bound by what
    scales with the rate), a range where it moves more (exposed memory traffic, which does not scale)."""
    rows = [r for r in report["rows"] if (r["N"], r["d"]) == (n, d)]
    lines = ["| design | executed TFLOP | HBM GB | predicted ms | TFLOP/s (useful) | % of GEMM |",
             "|---|---|---|---|---|---|"]
    for i, (design, eff, name, bold) in enumerate(DOC_ROWS):
        at = [r for r in rows if r["design"] == design and (eff is None or r["triton_eff"] == eff)]
        by_rate = {r["gemm_tflops"]: r for r in at}
        if len(by_rate) != 2 or (eff is None and len({(r["gemm_tflops"], r["predicted_ms"]) for r in at}) != 2):
            raise ValueError(f"kernel_model.json: {design} at N {n}, d {d}, efficiency {eff}: expected one "
                             f"prediction per cuBLAS rate (two rates), got {len(at)} rows")
        slow, fast = by_rate[min(by_rate)], by_rate[max(by_rate)]
        pct = sorted((slow["predicted_pct_of_gemm"], fast["predicted_pct_of_gemm"]))
        cells = [f"{_ms(fast['predicted_ms'])}–{_ms(slow['predicted_ms'])}",
                 f"{slow['predicted_tflops']:.0f}–{fast['predicted_tflops']:.0f}",
                 f"{pct[0]:.0f}–{pct[1]:.0f}" if pct[1] - pct[0] >= 0.25 else f"{slow['predicted_pct_of_gemm']:.0f}"]
        dh_gb = sum(p["bytes_exposed"] for p in slow["phases"] if p["phase"].startswith("dH +=")) / 1e9
        label = name.format(dh_gb=f"{dh_gb:.0f}")
        if eff is not None:
            label += f", Triton at {eff:g}" + (" of cuBLAS" if i == 0 else "")
        if bold:
            label, cells = f"**{label}**", [f"**{c}**" for c in cells]
        lines.append(f"| {label} | {slow['executed_tflop']:.3g} | {slow['hbm_gb']:.3g} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + divergence_table(report)


DIVERGENCE_LABELS = {"reverse_kl": "reverse KL", "forward_kl": "forward KL", "jsd": "JSD"}


def divergence_table(report: dict) -> str:
    """The divergence kernels' predictions (DIVERGENCE_DESIGNS at DIVERGENCE_SHAPES) from results/kernel_model.json:
    per kind and phase the executed FLOPs, the predicted time over the two cuBLAS rates at each assumed Triton
    efficiency, and the useful work (2 logits GEMMs forward, + dW and dH with the backward) as a share of the time."""
    lines = ["Divergence kernels (`divergence_forward`, `divergence_backward`; two contexts on each W tile), predicted "
             "the same way; \"% of GEMM\" counts 2 GEMMs of useful work forward, 4 forward + backward:", "",
             "| shape | divergence | executed TFLOP | HBM GB | predicted ms, Triton at 0.7 | at 0.6 | % of GEMM |",
             "|---|---|---|---|---|---|---|"]
    for n, d, vocab in DIVERGENCE_SHAPES:
        for design in DIVERGENCE_DESIGNS:
            at = {(r["triton_eff"], r["gemm_tflops"]): r for r in report["rows"]
                  if (r["N"], r["d"], r["V"], r["design"]) == (n, d, vocab, design)}
            rates = sorted({rate for _, rate in at})
            if len(at) != 2 * len(TRITON_EFFS) or len(rates) != 2:
                raise ValueError(f"kernel_model.json: {design} at N {n}, d {d}, V {vocab}: expected one prediction "
                                 f"per cuBLAS rate and Triton efficiency, got {len(at)} rows")
            ms = {eff: f"{_ms(at[eff, rates[1]]['predicted_ms'])}–{_ms(at[eff, rates[0]]['predicted_ms'])}"
                  for eff in TRITON_EFFS}
            pct = sorted(at[eff, rates[0]]["predicted_pct_of_gemm"] for eff in TRITON_EFFS)
            kind = design.removeprefix("div_").removesuffix("_fwd_bwd").removesuffix("_fwd")
            phase = "forward + backward" if design.endswith("_fwd_bwd") else "forward"
            slow = at[TRITON_EFFS[-1], rates[0]]
            lines.append(f"| N {n:,}, d {d}, V {vocab:,} | {DIVERGENCE_LABELS[kind]} {phase} | "
                         f"{slow['executed_tflop']:.3g} | {slow['hbm_gb']:.3g} | {ms[0.7]} | {ms[0.6]} | "
                         f"{pct[0]:.0f}–{pct[1]:.0f} |")
    return "\n".join(lines)


# The shape the model prices and benchmarks/gemm_reference.py measures (Qwen2.5-7B's LM head: d = 3584 is its
# hidden size, 4096 the round shape of the docs' examples); `--n` runs at it unless --d / --v say otherwise.
MODEL_D, MODEL_V = 4096, 152064
FULL_N = (4096, 16384, 32768)
QUICK_N = (4096, 16384)
FULL_DV = ((3584, 152064), (4096, 128256))
QUICK_DV = ((3584, 152064),)


def _time_ms(torch, fn, reps: int, warmup: int = 1) -> float:
    if not torch.cuda.is_available():  # --dry-run on CPU: wall clock
        return 1e3 * statistics.median(time_reps(fn, reps, warmup))
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def _peak_extra_mib(torch, fn) -> float | None:
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _variants(torch, n, d, vocab, modes, device="cuda"):
    """name -> (forward fn | None, forward+backward fn | None); each fn runs once and drops its outputs."""
    from seedfast.ops import fused_loss, linear_logprob

    g = torch.Generator(device=device).manual_seed(0)
    hidden = (torch.randn(n, d, device=device, generator=g) / d**0.5).to(torch.bfloat16).requires_grad_()
    teacher = torch.randn(n, d, device=device, generator=g).to(torch.bfloat16) / d**0.5
    weight = (torch.randn(vocab, d, device=device, generator=g) * 2).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, vocab, (n,), device=device, generator=g)
    upstream = torch.randn(n, device=device, generator=g)

    def ours_fwd(teacher_hidden=None):
        with torch.no_grad():
            out = linear_logprob(hidden, weight, targets, teacher_hidden=teacher_hidden, backend="triton")
        return out.logprob if teacher_hidden is None else out.teacher_logprob

    stacked = torch.cat([hidden.detach(), teacher])
    stacked_targets = targets.repeat(2)

    def ours_stacked_fwd():  # the dual-context op's alternative: [h; h_teacher] as 2N rows, single-context kernel
        with torch.no_grad():
            return linear_logprob(stacked, weight, stacked_targets, backend="triton").logprob[:n]

    def clear():
        grad = hidden.grad
        hidden.grad = weight.grad = None
        return grad

    def ours_fwd_bwd():
        out = linear_logprob(hidden, weight, targets, backend="triton")
        (out.logprob * upstream).sum().backward()
        return clear()

    token_weights = torch.full((n,), 1.0 / n, device=device)

    def ours_loss_fwd_bwd():  # the training loss: fused_loss's single pass (6NVd)
        loss, _ = fused_loss(hidden, weight, targets, token_weights=token_weights, advantages=upstream,
                             old_logprob=None, backend="triton")
        loss.backward()
        return clear()

    def ours_loss_two_pass_fwd_bwd():  # the same loss with the single pass turned off (8NVd, less memory)
        saved = os.environ.get("SEEDFAST_TRITON_FUSED_MB")
        os.environ["SEEDFAST_TRITON_FUSED_MB"] = "0"
        try:
            return ours_loss_fwd_bwd()
        finally:
            if saved is None:
                del os.environ["SEEDFAST_TRITON_FUSED_MB"]
            else:
                os.environ["SEEDFAST_TRITON_FUSED_MB"] = saved

    def eager_logprob(h, w, y):
        logits = (h @ w.T).float()
        return torch.log_softmax(logits, dim=-1).gather(1, y[:, None])[:, 0]

    def eager_fwd():
        with torch.no_grad():
            return eager_logprob(hidden, weight, targets)

    def eager_fwd_bwd(fn=eager_logprob):
        (fn(hidden, weight, targets) * upstream).sum().backward()
        return clear()

    variants = {
        "cublas_gemm": (lambda: hidden.detach() @ weight.detach().T, None),
        "ours": (ours_fwd, ours_fwd_bwd),
        "ours_loss": (None, ours_loss_fwd_bwd),
        "ours_loss_two_pass": (None, ours_loss_two_pass_fwd_bwd),
        "ours_dual": (lambda: ours_fwd(teacher), None),
        "ours_dual_stacked": (ours_stacked_fwd, None),
        "eager": (eager_fwd, eager_fwd_bwd),
    }
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        liger = LigerFusedLinearCrossEntropyLoss(reduction="sum")

        def liger_fwd_bwd():
            liger(weight, hidden, targets).backward()  # gradients are computed inside its forward
            clear()  # no error column: its loss is a cross entropy, not Σ upstream·ℓ

        variants["liger_flce"] = (None, liger_fwd_bwd)
    except ImportError:
        pass
    if "compile" in modes:  # last: its first call compiles (once, dynamic shapes)
        compiled = torch.compile(eager_logprob, dynamic=True)

        def compiled_fwd():
            with torch.no_grad():
                return compiled(hidden, weight, targets)

        variants["torch_compile"] = (compiled_fwd, lambda: eager_fwd_bwd(compiled))
    outputs_mib = {"fwd": n * 4 * 4 / 2**20, "fwd_bwd": (n * d + vocab * d) * 2 / 2**20}
    check = _ErrorCheck(torch, hidden.detach(), teacher, weight.detach(), targets, upstream, token_weights)
    return variants, outputs_mib, check


def _divergence_variants(torch, n, d, vocab, modes, device="cuda"):
    """name -> (forward fn, forward+backward fn) of the divergence kernels, one per kind (div_reverse_kl,
    div_forward_kl, div_jsd at β = 0.5), called through the Triton backend's protocol as the autograd op does:
    divergence_forward, then divergence_backward with per-token-mean coefficients. The fwd_bwd fn returns dH."""
    from seedfast.ops import triton_divergence as tb

    g = torch.Generator(device=device).manual_seed(0)
    hidden = (torch.randn(n, d, device=device, generator=g) / d**0.5).to(torch.bfloat16)
    teacher = (hidden.float() + 0.5 * torch.randn(n, d, device=device, generator=g) / d**0.5).to(torch.bfloat16)
    weight = (torch.randn(vocab, d, device=device, generator=g) * 2).to(torch.bfloat16)
    coef = torch.full((n,), 1.0 / n, device=device)
    active = coef != 0

    def variant(kind):
        setup = dict(kind=kind, beta=0.5, temperature=1.0)

        def fwd():
            return tb.divergence_forward(hidden, teacher, weight, active, **setup)[0]

        def fwd_bwd():
            _, center, lse, tlse = tb.divergence_forward(hidden, teacher, weight, active, **setup)
            return tb.divergence_backward(hidden, teacher, weight, lse, tlse, center, coef, **setup)[0]

        return fwd, fwd_bwd

    variants = {"cublas_gemm": (lambda: hidden @ weight.T, None)}
    variants.update({f"div_{kind}": variant(kind) for kind in ("reverse_kl", "forward_kl", "jsd")})
    outputs_mib = {"fwd": n * 4 * 4 / 2**20, "fwd_bwd": (n * d + vocab * d) * 2 / 2**20}
    return variants, outputs_mib, _DivergenceCheck(torch, hidden, teacher, weight, coef)


class _DivergenceCheck:
    """Max relative error of a divergence variant against fp64 on a fixed sample of rows (a row's D and its dH row
    depend on that row alone): forward variants return D [N], forward + backward ones dH."""

    ROWS = 256

    def __init__(self, torch, hidden, teacher, weight, coef):
        n = hidden.shape[0]
        self.rows = torch.linspace(0, n - 1, min(n, self.ROWS), device=hidden.device).long()
        self.ref = {}
        w = weight.double()
        for kind in ("reverse_kl", "forward_kl", "jsd"):
            h = hidden[self.rows].double().requires_grad_()
            ls = torch.log_softmax(h @ w.T, -1)
            lt = torch.log_softmax(teacher[self.rows].double() @ w.T, -1)
            if kind == "reverse_kl":
                value = (ls.exp() * (ls - lt)).sum(-1)
            elif kind == "forward_kl":
                value = (lt.exp() * (lt - ls)).sum(-1)
            else:
                lm = torch.logaddexp(ls, lt) - math.log(2.0)
                value = 0.5 * ((lt.exp() * (lt - lm)).sum(-1) + (ls.exp() * (ls - lm)).sum(-1))
            (value * coef[self.rows].double()).sum().backward()
            self.ref[f"div_{kind}", "fwd"] = value.detach()
            self.ref[f"div_{kind}", "fwd_bwd"] = h.grad

    def __call__(self, name: str, phase: str, out) -> float | None:
        ref = self.ref.get((name, phase))
        if ref is None or out is None:
            return None
        got = out[self.rows].double()
        return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


class _ErrorCheck:
    """Max relative error of a variant's output against fp64 on a fixed sample of rows (a row's log-prob and its dH
    row depend on that row alone, so the sample needs no [N, V] in fp64): forward variants return log-probs
    (the teacher's for ours_dual), forward + backward variants the hidden gradient. The loss variants run on-policy
    GRPO with per-token-mean weights, whose per-token gradient weight is exactly -A_t/N; linear_logprob's backward
    gets `upstream`. None where a variant returns nothing comparable (the GEMM, Liger's cross entropy)."""

    ROWS = 256

    def __init__(self, torch, hidden, teacher, weight, targets, upstream, token_weights):
        n = hidden.shape[0]
        self.rows = torch.linspace(0, n - 1, min(n, self.ROWS), device=hidden.device).long()
        w = weight.double()
        y = targets[self.rows]
        self.ref = {}
        for key, h in (("student", hidden), ("teacher", teacher)):
            logp = torch.log_softmax(h[self.rows].double() @ w.T, dim=-1)
            self.ref[key] = logp.gather(1, y[:, None])[:, 0]
            if key == "student":
                onehot = torch.zeros_like(logp).scatter_(1, y[:, None], 1.0)
                dz = onehot - logp.exp()
                self.ref["dh_upstream"] = (upstream[self.rows].double()[:, None] * dz) @ w
                self.ref["dh_loss"] = (-(upstream * token_weights)[self.rows].double()[:, None] * dz) @ w

    def __call__(self, name: str, phase: str, out) -> float | None:
        if out is None or not hasattr(out, "shape") or name in ("cublas_gemm", "liger_flce"):
            return None
        if phase == "fwd":
            ref = self.ref["teacher" if name == "ours_dual" else "student"]
        else:
            ref = self.ref["dh_loss" if name.startswith("ours_loss") else "dh_upstream"]
        got = out[self.rows].double()
        return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def _path_of(name: str, counts: dict) -> str:
    """The path a variant's call took: the op paths triton_backend recorded (a silent fallback shows here)."""
    if not name.startswith(("ours", "div_")):
        return {"cublas_gemm": "cublas", "eager": "eager, materialized logits", "liger_flce": "liger-kernel",
                "torch_compile": "torch.compile"}.get(name, name)
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) or "none recorded"


# Which model design each measured variant runs (docs/kernels.md).
MODEL_OF = {("ours", "fwd"): "after_fwd", ("ours", "fwd_bwd"): "after_two_pass_fwd_bwd",
            ("ours_loss", "fwd_bwd"): "after_single_pass_fwd_bwd",
            ("ours_loss_two_pass", "fwd_bwd"): "after_two_pass_fwd_bwd"}


def measure_bandwidth_tbs(torch, gib: float = 1.0, reps: int = 5) -> float:
    """HBM bandwidth of a device-to-device copy (read + write) of `gib` GiB, TB/s."""
    src = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda" if torch.cuda.is_available() else "cpu")
    dst = torch.empty_like(src)
    ms = _time_ms(torch, lambda: dst.copy_(src), reps)
    return 2 * gib * 2**30 / (ms / 1e3) / 1e12


def run(ns, dvs, reps: int, modes, on_shape_done=None, bandwidth_tbs: float | None = None,
        gemm_ref: dict | None = None, divergence: bool = False) -> list[dict]:
    import torch

    from seedfast.ops import triton_backend

    cuda = torch.cuda.is_available()
    sms = torch.cuda.get_device_properties(0).multi_processor_count if cuda else 132
    oom = torch.cuda.OutOfMemoryError if cuda else MemoryError
    rows = []
    for d, vocab in dvs:
        for n in ns:
            make = _divergence_variants if divergence else _variants
            variants, outputs, check = make(torch, n, d, vocab, modes, "cuda" if cuda else "cpu")
            flops = {"fwd": 2.0 * n * vocab * d, "fwd_bwd": 6.0 * n * vocab * d}
            gemm_ms = None
            for name, fns in variants.items():
                for phase, fn in zip(("fwd", "fwd_bwd"), fns):
                    if fn is None:
                        continue
                    row = {"N": n, "d": d, "V": vocab, "variant": name, "phase": phase}
                    try:
                        triton_backend.reset_path_counts()
                        result = fn()  # once more than the timings: the error against fp64 and the path taken
                        row.update(path=_path_of(name, triton_backend.path_counts()),
                                   max_rel_err=check(name, phase, result))
                        del result
                        ms = _time_ms(torch, fn, reps, warmup=0)
                        contexts = 2 if name.startswith("ours_dual") else 1  # teacher rows: twice the logits
                        work = (2.0 * n * vocab * d * useful_gemms(f"{name}_{phase}") if name.startswith("div_")
                                else contexts * flops[phase])
                        row.update(ms=ms, tflops=work / ms / 1e9,
                                   peak_extra_mib=_peak_extra_mib(torch, fn), outputs_mib=outputs[phase])
                    except oom:
                        row.update(error="out of memory")
                    except Exception as err:  # noqa: BLE001 - a failing peer is reported, not fatal
                        row.update(error=f"{type(err).__name__}: {str(err)[:120]}")
                    if cuda:
                        torch.cuda.empty_cache()
                    if name == "cublas_gemm" and "ms" in row:
                        gemm_ms = row["ms"]
                    if "ms" in row and gemm_ms:
                        # Same FLOP rate as the GEMM = 100%; forward + backward is 3 GEMMs of work.
                        design = MODEL_OF.get((name, phase)) or (f"{name}_{phase}" if name.startswith("div_") else None)
                        row["pct_of_gemm"] = 100.0 * gemm_ms * useful_gemms(design or f"x_{phase}") / row["ms"]
                        if design and bandwidth_tbs:  # the roofline from this run's GEMM rate and bandwidth
                            gemm_tflops = flops["fwd"] / gemm_ms / 1e9
                            ref = gemm_ref if gemm_ref and (gemm_ref.get("shape", {}).get("N"),
                                                             gemm_ref.get("shape", {}).get("d"),
                                                             gemm_ref.get("shape", {}).get("V")) == (n, d, vocab) \
                                else None
                            for eff, key in ((1.0, "predicted_ms_bound"), (TRITON_EFF, "predicted_ms")):
                                model = predict(design, n, d, vocab, gemm_tflops, bandwidth_tbs, sms, eff,
                                                measured=ref)
                                row[key] = model["predicted_ms"]
                            row.update(executed_tflop=model["executed_tflop"], hbm_gb=model["hbm_gb"],
                                       model_design=design)
                    rows.append(row)
                    print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
                    if on_shape_done:
                        on_shape_done(rows)
            del variants
            if cuda:
                torch.cuda.empty_cache()
            if on_shape_done:
                on_shape_done(rows)
    return rows


def _dual_overhead(rows) -> list[dict]:
    """Teacher rows' cost over the plain forward, per dual design: the two-accumulator kernel (ours_dual) and the
    stacked [h; h_teacher] batch through the single-context kernel (ours_dual_stacked); the window picks the faster."""
    out = []
    for r in rows:
        if r["variant"] == "ours" and r["phase"] == "fwd" and "ms" in r:
            entry = {"N": r["N"], "d": r["d"], "V": r["V"]}
            for name, key in (("ours_dual", "teacher_cost_vs_separate_forward"),
                              ("ours_dual_stacked", "teacher_cost_stacked_2n_rows")):
                dual = next((x for x in rows if x["variant"] == name and x["N"] == r["N"] and x["V"] == r["V"]
                             and "ms" in x), None)
                if dual:
                    entry[key] = (dual["ms"] - r["ms"]) / r["ms"]
            if len(entry) > 3:
                out.append(entry)
    return out


def _plot(rows, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, phase in zip(axes, ("fwd", "fwd_bwd")):
        sel = [r for r in rows if r["phase"] == phase and "tflops" in r]
        shapes = sorted({(r["N"], r["d"], r["V"]) for r in sel})
        names = sorted({r["variant"] for r in sel})
        width = 0.8 / max(1, len(names))
        for i, name in enumerate(names):
            vals = [next((r["tflops"] for r in sel if r["variant"] == name and (r["N"], r["d"], r["V"]) == s), 0)
                    for s in shapes]
            ax.bar([k + i * width for k in range(len(shapes))], vals, width, label=name)
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(shapes))])
        ax.set_xticklabels([f"N={s[0]}\nd={s[1]}\nV={s[2]}" for s in shapes], fontsize=7)
        ax.set_ylabel("model TFLOP/s")
        ax.set_title(f"{phase} (bf16)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def dry_run() -> int:
    os.environ["TRITON_INTERPRET"] = "1"  # before seedfast.kernels is imported
    os.environ.setdefault("SEEDFAST_OPS_BACKEND", "triton")
    import torch

    from seedfast.kernels.interpreter_patches import patch_interpreter

    patch_interpreter()  # the interpreter's bf16 dot and cast, as the GPU computes them; its scalar indices

    bandwidth = measure_bandwidth_tbs(torch, gib=1 / 16, reps=1)
    rows = run((96,), ((32, 300),), reps=1, modes=set(), bandwidth_tbs=bandwidth)
    rows += run((96,), ((32, 300),), reps=1, modes=set(), bandwidth_tbs=bandwidth, divergence=True)
    bad = [r for r in rows if "error" in r]
    print_table(rows, ["N", "d", "V", "variant", "phase", "ms", "predicted_ms", "pct_of_gemm", "max_rel_err", "path",
                       "error"], title="\ndry run (interpreter, CPU: times mean nothing)")
    expected = {("cublas_gemm", "fwd"), ("ours", "fwd"), ("ours", "fwd_bwd"), ("ours_loss", "fwd_bwd"),
                ("ours_loss_two_pass", "fwd_bwd"), ("ours_dual", "fwd"), ("ours_dual_stacked", "fwd"), ("eager", "fwd"),
                ("eager", "fwd_bwd")} | {(f"div_{kind}", phase) for kind in ("reverse_kl", "forward_kl", "jsd")
                                         for phase in ("fwd", "fwd_bwd")}
    missing = expected - {(r["variant"], r["phase"]) for r in rows}
    # bf16 inputs: a log-prob or dH row within 2% of fp64 (the gpu tests' tolerance); the loss ran its single pass
    wrong = [r for r in rows if (r.get("max_rel_err") or 0.0) > 2e-2 or (
        r["variant"] == "ours_loss" and "fused.single_pass" not in r.get("path", ""))]
    print(f"dry run: {len(rows)} rows, {len(bad)} errors, {len(wrong)} wrong, missing {sorted(missing) or 'none'}")
    return 1 if bad or missing or wrong else 0


def write_model(gemm_ref: str | None = None) -> int:
    report = model_report(gemm_ref=json.loads(Path(gemm_ref).read_text()) if gemm_ref else None)
    columns = ["N", "d", "V", "design", "gemm_tflops", "triton_eff", "useful_tflop", "executed_tflop", "hbm_gb",
               "predicted_ms", "predicted_tflops", "predicted_pct_of_gemm"]
    print_table(report["rows"], columns, title=f"predicted on {report['device']['name']} (a model, not a measurement)")
    path = write_results("kernel_model", report, packages=("triton", "torch"))
    print(f"wrote {path}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU needed: every variant once at a tiny shape under TRITON_INTERPRET=1 (checks that "
                             "this script runs before a GPU window; times and numbers mean nothing); writes no file")
    parser.add_argument("--model", action="store_true",
                        help="no GPU needed: the model's prediction (before/after) -> results/kernel_model.json, at "
                             "the cuBLAS rate of --gemm-ref or, without it, the assumed H200 range")
    parser.add_argument("--divergence", action="store_true",
                        help="the divergence kernels instead (every kind, forward and forward + backward, beside a "
                             "cuBLAS GEMM of the shape); default shape Qwen2.5-0.5B's head, N=4096 d=896 V=151936")
    parser.add_argument("--n", type=int, nargs="+", default=None,
                        help="token counts (default: by --quick); with --n the shape is --d x --v, the model's")
    parser.add_argument("--d", type=int, default=MODEL_D, help=f"hidden size with --n (default {MODEL_D})")
    parser.add_argument("--v", type=int, default=MODEL_V, help=f"vocabulary with --n (default {MODEL_V})")
    parser.add_argument("--out", default=None, help="results JSON (default: results/kernels.json)")
    parser.add_argument("--gemm-ref", default=None,
                        help="benchmarks/gemm_reference.py's JSON from this run: recorded beside the rows, and the "
                             "rate --model rates against")
    args = parser.parse_args(argv)
    if args.model:
        return write_model(args.gemm_ref if args.gemm_ref and Path(args.gemm_ref).exists() else None)
    if args.dry_run:
        return dry_run()
    try:
        import torch
    except ImportError:
        print("benchmarks/kernels.py needs torch; nothing measured")
        return 0
    if not torch.cuda.is_available():
        print("benchmarks/kernels.py: no CUDA GPU here; nothing measured (kernel_report.py checks the "
              "kernels without a GPU)")
        return 0
    modes = set() if args.no_compile else {"compile"}
    bandwidth = measure_bandwidth_tbs(torch)
    from seedfast.ops import triton_backend

    meta = {"dtype": "bfloat16", "reps": args.reps, "quick": args.quick,
            "flop_convention": "fwd 2NVd, fwd+bwd 6NVd (model FLOPs); executed_tflop: what the design runs",
            "measured_bandwidth_tbs": bandwidth, "triton_eff_assumed": TRITON_EFF,
            "gemm_f32_output_mode": triton_backend.gemm_f32_mode("cuda"), "reference_points": REFERENCE_POINTS}
    if args.gemm_ref and Path(args.gemm_ref).exists():
        meta["gemm_reference"] = json.loads(Path(args.gemm_ref).read_text())
    packages = ("torch", "triton", "liger-kernel", "seedfast")

    def save(payload):
        if args.out:
            write_json_atomic(Path(args.out), {**payload, "versions": versions(*packages)})
            return Path(args.out)
        return write_results("kernels", payload, packages=packages)

    def save_partial(rows):  # a run cut short by a time limit still leaves every measured row
        save({**meta, "partial": True, "rows": rows})

    ns = tuple(args.n) if args.n else QUICK_N if args.quick else FULL_N
    dvs = ((args.d, args.v),) if args.n else QUICK_DV if args.quick else FULL_DV
    if args.divergence:
        ns, dvs = (tuple(args.n), ((args.d, args.v),)) if args.n else ((4096,), ((896, 151936),))
        meta["flop_convention"] = "two contexts: fwd 4NVd, fwd+bwd 8NVd (useful); executed_tflop: what runs"
    print(f"shapes: N in {ns} x (d, V) in {dvs}", flush=True)
    rows = run(ns, dvs, args.reps, modes, save_partial, bandwidth, meta.get("gemm_reference"), args.divergence)
    columns = ["N", "d", "V", "variant", "phase", "ms", "predicted_ms", "predicted_ms_bound", "tflops", "pct_of_gemm",
               "max_rel_err", "executed_tflop", "hbm_gb", "peak_extra_mib", "outputs_mib", "path", "error"]
    print_table(rows, columns, title=f"\nfused linear log-prob, bf16, {torch.cuda.get_device_name(0)}")
    dual = _dual_overhead(rows)
    print_table(dual, ["N", "d", "V", "teacher_cost_vs_separate_forward", "teacher_cost_stacked_2n_rows"],
                title="\ndual context: two accumulators vs stacked 2N rows")
    plot = Path(args.out).with_suffix(".png") if args.out else RESULTS_DIR / "kernels.png"
    plot.parent.mkdir(parents=True, exist_ok=True)
    plotted = not args.out and _plot(rows, plot)  # a window's OUT holds at most 8 files: no plot there
    path = save({**meta, "partial": False, "rows": rows, "dual_context": dual, "plot": str(plot) if plotted else None})
    print(f"wrote {path}" + (f" and {plot}" if plotted else " (matplotlib not installed: no plot)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
