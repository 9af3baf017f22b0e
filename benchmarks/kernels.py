"""GPU microbenchmark of the fused linear log-prob kernels (bf16) against materialized logits and peers.

    python benchmarks/kernels.py            # N in {4096, 16384, 32768} x (d, V) in {(3584, 152064), (4096, 128256)}
    python benchmarks/kernels.py --quick    # N in {4096, 16384}, (3584, 152064) only

Variants: ours (single context), ours dual (teacher rows on the same W tiles, forward only: the teacher takes
no gradient), PyTorch eager with materialized logits, torch.compile of the same, Liger-Kernel's fused linear
cross entropy when installed, and a cuBLAS bf16 GEMM of the logits shape as the roofline. Times are medians
of CUDA-event timings; memory is the peak allocated above the inputs (outputs included, listed apart).
TFLOP/s count the model FLOPs: 2·N·V·d forward, 6·N·V·d forward + backward (what a linear layer needs;
the kernels also recompute the logits in backward, 8·N·V·d in all). Writes results/kernels.json and a PNG.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS_DIR, print_table, write_results  # noqa: E402

FULL_N = (4096, 16384, 32768)
QUICK_N = (4096, 16384)
FULL_DV = ((3584, 152064), (4096, 128256))
QUICK_DV = ((3584, 152064),)


def _time_ms(torch, fn, reps: int, warmup: int = 1) -> float:
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


def _peak_extra_mib(torch, fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _variants(torch, n, d, vocab, modes):
    """name -> (forward fn | None, forward+backward fn | None); each fn runs once and drops its outputs."""
    from seedfast.ops import linear_logprob

    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = (torch.randn(n, d, device="cuda", generator=g) / d**0.5).to(torch.bfloat16).requires_grad_()
    teacher = torch.randn(n, d, device="cuda", generator=g).to(torch.bfloat16) / d**0.5
    weight = (torch.randn(vocab, d, device="cuda", generator=g) * 2).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, vocab, (n,), device="cuda", generator=g)
    upstream = torch.randn(n, device="cuda", generator=g)

    def clear():
        hidden.grad = weight.grad = None

    def ours_fwd(teacher_hidden=None):
        with torch.no_grad():
            linear_logprob(hidden, weight, targets, teacher_hidden=teacher_hidden, backend="triton")

    def ours_fwd_bwd():
        out = linear_logprob(hidden, weight, targets, backend="triton")
        (out.logprob * upstream).sum().backward()
        clear()

    def eager_logprob(h, w, y):
        logits = (h @ w.T).float()
        return torch.log_softmax(logits, dim=-1).gather(1, y[:, None])[:, 0]

    def eager_fwd():
        with torch.no_grad():
            eager_logprob(hidden, weight, targets)

    def eager_fwd_bwd(fn=eager_logprob):
        (fn(hidden, weight, targets) * upstream).sum().backward()
        clear()

    variants = {
        "cublas_gemm": (lambda: hidden.detach() @ weight.detach().T, None),
        "ours": (ours_fwd, ours_fwd_bwd),
        "ours_dual": (lambda: ours_fwd(teacher), None),
        "eager": (eager_fwd, eager_fwd_bwd),
    }
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        liger = LigerFusedLinearCrossEntropyLoss(reduction="sum")

        def liger_fwd_bwd():
            liger(weight, hidden, targets).backward()  # gradients are computed inside its forward
            clear()

        variants["liger_flce"] = (None, liger_fwd_bwd)
    except ImportError:
        pass
    if "compile" in modes:  # last: its first call compiles (once, dynamic shapes)
        compiled = torch.compile(eager_logprob, dynamic=True)

        def compiled_fwd():
            with torch.no_grad():
                compiled(hidden, weight, targets)

        variants["torch_compile"] = (compiled_fwd, lambda: eager_fwd_bwd(compiled))
    outputs_mib = {"fwd": n * 4 * 4 / 2**20, "fwd_bwd": (n * d + vocab * d) * 2 / 2**20}
    return variants, outputs_mib


def run(ns, dvs, reps: int, modes, on_shape_done=None) -> list[dict]:
    import torch

    rows = []
    for d, vocab in dvs:
        for n in ns:
            variants, outputs = _variants(torch, n, d, vocab, modes)
            flops = {"fwd": 2.0 * n * vocab * d, "fwd_bwd": 6.0 * n * vocab * d}
            gemm_ms = None
            for name, fns in variants.items():
                for phase, fn in zip(("fwd", "fwd_bwd"), fns):
                    if fn is None:
                        continue
                    row = {"N": n, "d": d, "V": vocab, "variant": name, "phase": phase}
                    try:
                        ms = _time_ms(torch, fn, reps)
                        contexts = 2 if name == "ours_dual" else 1  # teacher rows: twice the logits
                        row.update(ms=ms, tflops=contexts * flops[phase] / ms / 1e9,
                                   peak_extra_mib=_peak_extra_mib(torch, fn), outputs_mib=outputs[phase])
                    except torch.cuda.OutOfMemoryError:
                        row.update(error="out of memory")
                    except Exception as err:  # noqa: BLE001 - a failing peer is reported, not fatal
                        row.update(error=f"{type(err).__name__}: {str(err)[:120]}")
                    torch.cuda.empty_cache()
                    if name == "cublas_gemm" and "ms" in row:
                        gemm_ms = row["ms"]
                    if "ms" in row and gemm_ms:
                        # Same FLOP rate as the GEMM = 100%; forward + backward is 3 GEMMs of work.
                        row["pct_of_gemm"] = 100.0 * gemm_ms * (1 if phase == "fwd" else 3) / row["ms"]
                    rows.append(row)
                    print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
            del variants
            torch.cuda.empty_cache()
            if on_shape_done:
                on_shape_done(rows)
    return rows


def _dual_overhead(rows) -> list[dict]:
    out = []
    for r in rows:
        if r["variant"] == "ours" and r["phase"] == "fwd" and "ms" in r:
            dual = next((x for x in rows if x["variant"] == "ours_dual" and x["N"] == r["N"] and x["V"] == r["V"]
                         and "ms" in x), None)
            if dual:
                out.append({"N": r["N"], "d": r["d"], "V": r["V"],
                            "teacher_cost_vs_separate_forward": (dual["ms"] - r["ms"]) / r["ms"]})
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    args = parser.parse_args(argv)
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
    meta = {"dtype": "bfloat16", "reps": args.reps, "quick": args.quick,
            "flop_convention": "fwd 2NVd, fwd+bwd 6NVd (model FLOPs)"}
    packages = ("torch", "triton", "liger-kernel", "seedfast")

    def save_partial(rows):  # a run cut short by a time limit still leaves its measured shapes
        write_results("kernels", {**meta, "partial": True, "rows": rows}, packages=packages)

    rows = run(QUICK_N if args.quick else FULL_N, QUICK_DV if args.quick else FULL_DV, args.reps, modes,
               save_partial)
    columns = ["N", "d", "V", "variant", "phase", "ms", "tflops", "pct_of_gemm", "peak_extra_mib", "outputs_mib",
               "error"]
    print_table(rows, columns, title=f"\nfused linear log-prob, bf16, {torch.cuda.get_device_name(0)}")
    dual = _dual_overhead(rows)
    print_table(dual, ["N", "d", "V", "teacher_cost_vs_separate_forward"], title="\ndual context")
    plot = RESULTS_DIR / "kernels.png"
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    plotted = _plot(rows, plot)
    path = write_results("kernels", {**meta, "partial": False, "rows": rows, "dual_context": dual,
                                     "plot": str(plot) if plotted else None}, packages=packages)
    print(f"wrote {path}" + (f" and {plot}" if plotted else " (matplotlib not installed: no plot)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
