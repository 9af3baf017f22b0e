"""benchmarks/kernels.py without a GPU: the script's measuring code runs end to end (--dry-run, every variant at a
tiny shape under the interpreter, so that a GPU window is not lost to a crash), and its performance model counts
what docs/kernels.md says (FLOPs of each design, dH traffic, the prediction's ordering) and stays physically possible:
rated against a cuBLAS GEMM rate (measured, or the stated assumption), no phase is faster than the GEMMs it
contains, and no design beats the three GEMMs it is made of."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
N, D, V = 16384, 4096, 152064


@pytest.fixture(scope="module")
def bench():
    from benchmarks import kernels

    return kernels


def test_dry_run_runs_every_variant():
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "SEEDFAST_OPS_BACKEND")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.kernels", "--dry-run"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # every row within 2% of fp64 (bf16), the loss on its single pass: an interpreter without the bf16 patch gives
    # log-probs off by 1e9 and fails here
    assert "0 errors, 0 wrong, missing none" in proc.stdout
    assert "fused.single_pass x1" in proc.stdout and "fused.two_pass:budget x1" in proc.stdout


def test_model_counts_flops_and_bytes(bench):
    gemm = 2.0 * N * V * D
    single = bench.predict("after_single_pass_fwd_bwd", N, D, V, 780.0, 4.3)
    two_pass = bench.predict("after_two_pass_fwd_bwd", N, D, V, 780.0, 4.3)
    before = bench.predict("before_fwd_bwd", N, D, V, 780.0, 4.3)
    assert single["executed_tflop"] == pytest.approx(3 * gemm / 1e12)  # logits once: 6NVd
    assert two_pass["executed_tflop"] == before["executed_tflop"] == pytest.approx(4 * gemm / 1e12)  # 8NVd
    assert single["useful_tflop"] == pytest.approx(3 * gemm / 1e12)
    dh = {name: next(p for p in r["phases"] if p["phase"].startswith("dH"))["dh_rmw_gb"]
          for name, r in (("before", before), ("after", two_pass))}
    assert dh["after"] <= 10.0 < 39.0 < dh["before"]  # 256 MiB chunks: 19 chunks; 64 MiB: 75 chunks
    # With every kernel at the GEMM rate the two-pass design is capped at 6/8 of it; the single pass is not.
    bound = bench.predict("after_two_pass_fwd_bwd", N, D, V, 780.0, 4.3, triton_eff=1.0)
    assert bound["predicted_pct_of_gemm"] <= 75.0 + 1e-6
    assert single["predicted_pct_of_gemm"] > bound["predicted_pct_of_gemm"] > before["predicted_pct_of_gemm"]
    # At N = 1024 the forward's token blocks share every W tile: W is read from HBM once (before: 4 times).
    small = {b: bench.predict(f"{b}_fwd", 1024, D, V, 780.0, 4.3)["phases"][0]["w_reads"] for b in ("before", "after")}
    assert small == {"before": 4, "after": 1}


def test_model_is_physically_possible(bench):
    report = bench.model_report()
    assert report["gemm_rate_measured"] is False and "8192x8192x8192" in report["device"]["source"]
    assert report["device"]["gemm_tflops_range"] == [769.0, 798.0]
    # every input figure names its source; the forward's Triton efficiency is 0.6-0.7 of cuBLAS, never 0.8
    assert all(entry["source"] for entry in report["inputs"].values())
    assert report["triton_eff_assumed"] == [0.6, 0.7] and {r["triton_eff"] for r in report["rows"]} == {0.6, 0.7}
    rates = set()
    for row in report["rows"]:
        rates.add(row["gemm_tflops"])
        for p in row["phases"]:  # each phase takes at least its FLOPs' time at the cuBLAS rate
            assert p["ms"] >= p["gemm_ms"] * (1 - 1e-12), (row["design"], p["phase"])
        assert row["predicted_ms"] >= row["gemm_ms_of_useful_work"]
        assert row["predicted_pct_of_gemm"] <= 100.0 and row["predicted_tflops"] <= row["gemm_tflops"]
    assert rates == {769.0, 798.0}
    single = next(r for r in report["rows"] if r["design"] == "after_single_pass_fwd_bwd" and r["N"] == N
                  and r["d"] == D and r["gemm_tflops"] == 769.0)
    names = " ".join(p["phase"] for p in single["phases"])
    for counted in ("fp32 out", "row stats", "G from Z", "fp32 C", "dW fp32 -> bf16"):
        assert counted in names  # the logits round trip, the row passes, the dW read-modify-write, the cast
    dw = next(p for p in single["phases"] if "fp32 C" in p["phase"])
    assert dw["bytes_exposed"] > 0 and dw["ms"] > dw["gemm_ms"]
    with pytest.raises(ValueError):
        bench.predict("after_fwd", N, D, V, 780.0, 4.3, triton_eff=1.2)  # faster than cuBLAS: refused


def test_model_rates_against_a_measured_gemm(bench):
    ref = {"gpu": "NVIDIA H200", "gemm_tflops": 700.0, "copy_tbs": 4.0}
    report = bench.model_report(shapes=((N, D, V),), gemm_ref=ref)
    assert report["gemm_rate_measured"] is True
    assert {r["gemm_tflops"] for r in report["rows"]} == {700.0} and {r["hbm_tbs"] for r in report["rows"]} == {4.0}


def test_model_prices_each_phase_by_what_gemm_reference_measured(bench):
    # gemm_reference.py's JSON at the model's shape: the per-block GEMMs (K = R = 2048, fp32 C) slower than the
    # whole-shape rate, the row passes below copy bandwidth; each phase takes its own measured figure
    from benchmarks import gemm_reference as module

    shape = module.shapes(N, D, V)
    assert (shape["R"], shape["chunk"]) == (2048, 8192)
    assert shape["gemms"]["block_dw_f32c"] == (V, 2048, D) and shape["gemms"]["chunk_dh_f32c"] == (N, 8192, D)
    by_shape = {"logits": 780.0, "dw": 770.0, "dh": 760.0, "block_logits_f32": 700.0, "block_dh": 720.0,
                "block_dw_f32c": 500.0, "chunk_dw": 740.0, "chunk_dh_f32c": 650.0}
    ref = {"gpu": "NVIDIA H200", "gemm_tflops": 780.0, "copy_tbs": 4.3, "shape": shape,
           "gemm_tflops_by_shape": by_shape, "row_stats_tbs": 3.0, "grad_from_logits_tbs": 2.5}
    single = bench.predict("after_single_pass_fwd_bwd", N, D, V, 780.0, 4.3, measured=ref)
    phases = {p["phase"]: p for p in single["phases"]}
    dw = phases["dW += G^T.h (cuBLAS, fp32 C)"]
    assert dw["priced_by"] == "measured block_dw_f32c"
    assert dw["ms"] == pytest.approx(1e3 * 2 * N * V * D / 500e12)  # its fp32 C traffic is inside the measurement
    stats = phases["row stats (Triton): read Z"]
    assert stats["ms"] == pytest.approx(1e3 * N * V * 4 / 3.0e12)  # 8 blocks of 2048 rows, one fp32 read each
    assert single["measured_phases"] == 5
    # never faster than its GEMMs at their measured rates
    floor = 1e3 * sum(2 * N * V * D / (by_shape[k] * 1e12) for k in ("block_logits_f32", "block_dh", "block_dw_f32c"))
    assert single["predicted_ms"] >= floor
    report = bench.model_report(shapes=((N, D, V), (4096, D, V)), gemm_ref=ref)
    other = [r for r in report["rows"] if r["N"] == 4096]
    assert other and all(r["measured_phases"] == 0 for r in other)  # another shape: not the measured GEMMs


def test_committed_model_json_is_the_assumption_and_possible():
    import json

    saved = json.loads((REPO / "benchmarks" / "results" / "kernel_model.json").read_text())
    assert saved["gemm_rate_measured"] is False and saved["device"]["gemm_tflops_range"] == [769.0, 798.0]
    assert set(saved["inputs"]) >= {"gemm_tflops", "hbm_tbs", "triton_eff", "per_block_and_chunk_gemms", "row_passes"}
    assert saved["triton_eff_assumed"] == [0.6, 0.7]
    assert all(r["predicted_pct_of_gemm"] <= 100.0 for r in saved["rows"])


def test_divergence_model_counts_its_gemms_and_is_never_faster_than_them(bench):
    # forward: 2 GEMMs of logits (jsd: 4, a second pass for M); backward: G recomputed from both contexts (2 GEMMs)
    # plus dW and dH; rated against the 2 (forward) or 4 (forward + backward) GEMMs of useful work
    n, d, vocab = 4096, 896, 151936
    gemm = 2.0 * n * vocab * d
    for kind, fwd_gemms in (("reverse_kl", 2), ("forward_kl", 2), ("jsd", 4)):
        fwd = bench.predict(f"div_{kind}_fwd", n, d, vocab, 780.0, 4.3)
        both = bench.predict(f"div_{kind}_fwd_bwd", n, d, vocab, 780.0, 4.3)
        assert fwd["executed_tflop"] == pytest.approx(fwd_gemms * gemm / 1e12)
        assert both["executed_tflop"] == pytest.approx((fwd_gemms + 4) * gemm / 1e12)
        assert fwd["useful_tflop"] == pytest.approx(2 * gemm / 1e12)
        assert both["useful_tflop"] == pytest.approx(4 * gemm / 1e12)
        for row in (fwd, both):
            assert row["predicted_ms"] >= row["gemm_ms_of_useful_work"]
            assert all(p["ms"] >= p["gemm_ms"] * (1 - 1e-12) for p in row["phases"])
    saved = bench.model_report()
    shapes = {(r["N"], r["d"], r["V"]) for r in saved["rows"] if r["design"].startswith("div_")}
    assert shapes == {(4096, 896, 151936), (16384, 3584, 152064)}  # Qwen2.5-0.5B's head and 7B's
    assert "Divergence kernels" in bench.prediction_table(saved)
