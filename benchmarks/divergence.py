"""CPU benchmark of fused_divergence (a full-vocabulary divergence, no logits) against materialized logits and TRL.

    python -m benchmarks.divergence                   # N=4096, d=896, V=151,936 (Qwen2.5-0.5B's head), fp32
    python -m benchmarks.divergence --n 256 --reps 1 --out /tmp   # a quick look (writes /tmp/divergence_cpu.json)

One forward + backward w.r.t. the student's hidden rows and W of the token-mean divergence Σ_t D_t / N between the
student's logits h·Wᵀ and the teacher's ht·Wᵀ (stop-gradient), per variant:
- fused_<kind>: seedfast.ops.fused_divergence, torch backend (ops/chunked_divergence.py: blocks of whole vocabulary
  rows under SEEDFAST_OPS_DIVERGENCE_BYTES, 512 MiB by default).
- materialized_<kind>: the plain path at its best settings on this CPU: fp32 `torch.log_softmax` of h·Wᵀ and of
  ht·Wᵀ (the teacher's under no_grad), the divergence written out, autograd backward; eager, the same thread count.
- trl_<kind>: TRL's GKD loss (`trl.experimental.gkd.GKDTrainer.generalized_jsd_loss`, reduction "batchmean", every
  label valid) on the same materialized logits (the teacher's under no_grad), autograd backward.
kinds: reverse_kl, and jsd at β = 0.5 (TRL's convention: β = 1 is the reverse KL).

Time: one process runs every variant, round-robin (one warm-up call each, then `--reps` rounds, the order reversed
every other round so that a change in the machine's load falls on all alike); medians and their ratio to the
materialized path of the same kind. Memory: each variant in a fresh process, the peak resident set above its level
after the inputs are allocated and one small warm-up call (benchmarks/common.PeakRSS: VmHWM after clear_refs, glibc's
mmap threshold pinned so that freed [N, V] tensors go back to the OS and cannot hide in the allocator); the
gradients (W's is 4·V·d bytes on every side) are counted in the peak and reported beside it. A variant whose
estimated peak does not fit the memory available is not run (its row says so).

One file, results/divergence_cpu.json, holds a run per N: {"benchmark": "divergence_cpu", "runs": {"4096": <run>,
"1024": <run>}}; a run rewrites only its own entry.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time
from pathlib import Path

from benchmarks.common import (
    RESULTS_DIR,
    PeakRSS,
    median,
    print_table,
    results_record,
    run_worker,
    update_json_atomic,
    wrap_paragraph,
)

NAME = "divergence_cpu"
KINDS = {"reverse_kl": ("reverse_kl", 1.0), "jsd": ("jsd", 0.5)}  # name -> (kind, TRL's β)
SIDES = ("materialized", "fused", "trl")
VARIANTS = tuple(f"{side}_{kind}" for kind in KINDS for side in SIDES)
MALLOC_PINNED = {"MALLOC_MMAP_THRESHOLD_": "131072"}
# [N, V] fp32 tensors each side's peak holds beyond the gradients, for the fit check before a run: measured at
# N = 1024, d = 896, V = 151,936 (4.1, 8.1, 9.1 and 16.1 of them), rounded up; the fused side holds none.
LOGITS_TENSORS = {"materialized_reverse_kl": 5, "materialized_jsd": 9, "trl_reverse_kl": 10, "trl_jsd": 17}
FIT_FRACTION = 0.8  # of MemAvailable: other jobs share the machine, and an OOM kill may hit one of theirs
WARMUP_ROWS = 64
TEMPERATURE = 1.0  # the materialized side is written for 1 (no division)
TARGETS = {"memory_vs_materialized_max": 0.1, "time_vs_materialized_max": 1.0}


def make_inputs(n: int, d: int, vocab: int, seed: int = 0) -> dict:
    """Student hidden rows, teacher rows near them, an LM head at Qwen-like logit scales."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=gen) * (3.0 / d ** 0.5)
    teacher = hidden + torch.randn(n, d, generator=gen) * (1.5 / d ** 0.5)
    weight = torch.randn(vocab, d, generator=gen)
    return {"hidden": hidden.requires_grad_(), "teacher_hidden": teacher, "weight": weight.requires_grad_()}


def make_forward(variant: str, x: dict):
    """A closure computing the variant's loss Σ_t D_t / N with its autograd graph."""
    import torch

    side, name = variant.split("_", 1)
    kind, beta = KINDS[name]
    hidden, teacher, weight = x["hidden"], x["teacher_hidden"], x["weight"]
    n = hidden.shape[0]

    if side == "fused":
        from seedfast.ops import fused_divergence

        token_weights = torch.full((n,), 1.0 / n)
        return lambda: fused_divergence(hidden, teacher, weight, token_weights=token_weights, kind=kind, beta=beta,
                                        temperature=TEMPERATURE, backend="torch")[0]
    if side == "materialized":
        def forward():
            log_s = torch.log_softmax(hidden @ weight.t(), dim=-1)  # TEMPERATURE is 1: no division
            with torch.no_grad():
                log_t = torch.log_softmax(teacher @ weight.t(), dim=-1)
            if kind == "reverse_kl":
                value = (log_s.exp() * (log_s - log_t)).sum(-1)
            else:  # M = (1 − β)·p_s + β·p_t; D = β·KL(p_t‖M) + (1 − β)·KL(p_s‖M)
                log_m = torch.logaddexp(log_s + math.log1p(-beta), log_t + math.log(beta))
                value = (beta * (log_t.exp() * (log_t - log_m)).sum(-1)
                         + (1 - beta) * (log_s.exp() * (log_s - log_m)).sum(-1))
            return value.sum() / n
        return forward
    if side == "trl":
        trainer = _trl_trainer()
        labels = torch.zeros(1, n, dtype=torch.long)  # every token valid: "batchmean" divides by N

        def forward():
            student_logits = (hidden @ weight.t()).unsqueeze(0)
            with torch.no_grad():
                teacher_logits = (teacher @ weight.t()).unsqueeze(0)
            return trainer.generalized_jsd_loss(student_logits, teacher_logits, labels=labels, beta=beta,
                                                temperature=TEMPERATURE)
        return forward
    raise ValueError(f"unknown variant {variant!r}")


def _trl_trainer():
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl.experimental.gkd import GKDTrainer

    return GKDTrainer


def trl_status() -> str | None:
    """TRL's version if its GKD loss imports here, else None."""
    try:
        _trl_trainer()
    except Exception:  # noqa: BLE001 - any failure to import means "not available" on this machine
        return None
    from benchmarks.common import versions

    return versions("trl")["trl"] or "unknown"


def make_step(variant: str, x: dict):
    forward = make_forward(variant, x)

    def step():
        loss = forward()
        loss.backward()
        x["hidden"].grad = None
        x["weight"].grad = None
        return float(loss)

    return step


def _threads(threads: int | None) -> int:
    import torch

    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def time_worker(variants: list[str], n: int, d: int, vocab: int, reps: int, threads: int | None) -> dict:
    """Every variant in this process, round-robin: {variant: seconds, cpu seconds, loss}, plus the thread count."""
    torch_threads = _threads(threads)
    x = make_inputs(n, d, vocab)
    steps = {v: make_step(v, x) for v in variants}
    out = {v: {"seconds": [], "cpu_seconds": []} for v in variants}
    for v in variants:  # warm-up at full size (first touch, thread pools, lazy initialisation)
        out[v]["loss"] = steps[v]()
        gc.collect()
    for round_ in range(reps):
        for v in variants[::-1] if round_ % 2 else variants:
            wall, cpu = time.perf_counter(), time.process_time()
            steps[v]()
            out[v]["seconds"].append(time.perf_counter() - wall)
            out[v]["cpu_seconds"].append(time.process_time() - cpu)
            gc.collect()
    return {"variants": out, "torch_threads": torch_threads}


def memory_worker(variant: str, n: int, d: int, vocab: int, threads: int | None) -> dict:
    """The variant's peak resident memory above the inputs, in this (fresh) process."""
    torch_threads = _threads(threads)
    warm = make_inputs(min(WARMUP_ROWS, n), d, vocab, seed=1)
    make_step(variant, warm)()  # libraries' lazy initialisation, outside the measured peak
    del warm
    gc.collect()
    x = make_inputs(n, d, vocab)
    step = make_step(variant, x)
    gc.collect()
    with PeakRSS() as mem:
        step()
    grads = sum(t.numel() * t.element_size() for t in (x["hidden"], x["weight"]))
    return {"peak_extra_bytes": mem.extra_bytes, "grad_bytes": grads, "memory_method": mem.method,
            "torch_threads": torch_threads}


def mem_available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def estimated_peak_bytes(variant: str, n: int, d: int, vocab: int) -> int:
    """An estimate of the variant's peak above the inputs: its [N, V] tensors, the gradients and 512 MiB."""
    return LOGITS_TENSORS.get(variant, 0) * 4 * n * vocab + 4 * (vocab + n) * d + (512 << 20)


def run(args: argparse.Namespace) -> dict:
    """Measure, print the table, return the payload of the results file."""
    load_at_start = list(os.getloadavg())
    trl = trl_status()
    variants = [v for v in args.variants if not (v.startswith("trl") and trl is None)]
    available = mem_available_bytes()
    notes = {v: "not available (trl does not import)" for v in args.variants if v not in variants}
    for v in list(variants):
        need = estimated_peak_bytes(v, args.n, args.d, args.vocab)
        if available is not None and need > FIT_FRACTION * available:
            notes[v] = (f"not run: needs ~{need / 2**30:.0f} GiB, {available / 2**30:.0f} GiB available "
                        f"({LOGITS_TENSORS.get(v, 0)} [N, V] fp32 tensors)")
            variants.remove(v)
    common = ["--n", str(args.n), "--d", str(args.d), "--vocab", str(args.vocab)]
    if args.threads:
        common += ["--threads", str(args.threads)]
    mem_rows = {}
    for v in variants:
        mem_rows[v] = run_worker(["-m", __spec__.name, *common, "--worker", "memory", v], env=MALLOC_PINNED)
        print(f"  {v}: +{mem_rows[v]['peak_extra_bytes'] / 2**20:.0f} MiB", file=sys.stderr)
    timing = run_worker(["-m", __spec__.name, *common, "--reps", str(args.reps), "--worker", "time", *variants])
    logits_bytes = 4 * args.n * args.vocab
    rows = []
    for v in args.variants:
        side, kind = v.split("_", 1)
        row = {"variant": v, "side": side, "kind": kind}
        if v in notes:
            rows.append({**row, "note": notes[v]})
            continue
        t, m = timing["variants"][v], mem_rows[v]
        row.update(seconds=t["seconds"], cpu_seconds=t["cpu_seconds"], median_s=median(t["seconds"]),
                   median_cpu_s=median(t["cpu_seconds"]), loss=t["loss"], **m,
                   peak_extra_mib=m["peak_extra_bytes"] / 2**20,
                   extra_beyond_grads_mib=(m["peak_extra_bytes"] - m["grad_bytes"]) / 2**20)
        rows.append(row)
    by_name = {r["variant"]: r for r in rows}
    for r in rows:
        base = by_name.get(f"materialized_{r['kind']}")
        if "median_s" in r and base and "median_s" in base:
            r["time_vs_materialized"] = r["median_s"] / base["median_s"]
            r["cpu_vs_materialized"] = r["median_cpu_s"] / base["median_cpu_s"]
            r["memory_vs_materialized"] = r["peak_extra_bytes"] / max(base["peak_extra_bytes"], 1)
            r["loss_rel_diff"] = abs(r["loss"] - base["loss"]) / max(abs(base["loss"]), 1e-30)
    print_table(rows, ["variant", "median_s", "time_vs_materialized", "median_cpu_s", "peak_extra_mib",
                       "memory_vs_materialized", "extra_beyond_grads_mib", "loss", "note"],
                title=f"forward+backward (dh, dW), N={args.n} d={args.d} V={args.vocab} fp32 CPU, "
                      f"threads={timing['torch_threads']}; one [N, V] fp32 logits tensor = {logits_bytes / 2**20:.0f} "
                      "MiB")
    from seedfast.ops import chunked_divergence as cd

    budget = cd.divergence_budget_bytes()
    return {
        "shapes": {"n": args.n, "d": args.d, "vocab": args.vocab, "dtype": "float32", "temperature": TEMPERATURE,
                   "jsd_beta": KINDS["jsd"][1]},
        "torch_threads": timing["torch_threads"],
        "reps": args.reps,
        "logits_bytes": logits_bytes,
        "divergence_budget_bytes": budget,
        "block_rows": cd.block_rows(args.n, args.vocab, True, budget),
        "memory_method": "peak RSS above the inputs in a fresh process per variant (VmHWM after clear_refs, "
                         "MALLOC_MMAP_THRESHOLD_=131072), gradients included",
        "timing_method": f"one process, round-robin over the variants, one warm-up call each, median of {args.reps}",
        "trl": trl or "not available",
        "targets": TARGETS,
        "loadavg_1_5_15_at_start": load_at_start,
        "mem_available_bytes_at_start": available,
        "note": args.note,
        "results": rows,
    }


def _ratio(x: float, good: bool) -> str:
    return f"**{x:.2f}×**" if good else f"{x:.2f}×"


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


def docs_table(data: dict) -> str:
    """The table of docs/performance.md, 'Full-vocabulary divergences without logits' (make docs), from
    results/divergence_cpu.json: per run (N, largest first) and kind, each side's time and peak memory against the
    materialized path, then where each run was measured."""
    runs = sorted(data["runs"].values(), key=lambda r: -r["shapes"]["n"])
    s0 = runs[0]["shapes"]
    lines = [f"| d = {s0['d']}, V = {s0['vocab']:,}, fp32, fwd + bwd (dh, dW) | N | time | vs materialized | "
             "peak memory (grads included) | vs materialized |", "|---|---|---|---|---|---|"]
    notes = []
    for record in runs:
        s, m = record["shapes"], record["machine"]
        labels = {"materialized": "materialized logits (`log_softmax`, autograd)",
                  "fused": "`fused_divergence` (torch)", "trl": f"TRL {record['trl']} `generalized_jsd_loss`"}
        kinds = {"reverse_kl": "reverse KL", "jsd": f"JSD β = {s['jsd_beta']}"}
        for r in record["results"]:
            label = f"{kinds[r['kind']]}: {labels[r['side']]}"
            if "median_s" not in r:
                lines.append(f"| {label} | {s['n']:,} | – | – | – | {r['note']} |")
                continue
            side, t, mem = r["side"], r.get("time_vs_materialized"), r.get("memory_vs_materialized")
            t_cell = "–" if t is None else "1" if side == "materialized" else _ratio(t, side == "fused" and t <= 1.0)
            m_cell = ("–" if mem is None else "1" if side == "materialized"
                      else _ratio(mem, side == "fused" and mem <= 0.1))
            lines.append(f"| {label} | {s['n']:,} | {r['median_s']:.1f} s | {t_cell} | {_size(r['peak_extra_bytes'])} "
                         f"| {m_cell} |")
        load = record["loadavg_1_5_15_at_start"][0]
        notes.append(f"N = {s['n']:,}: {m['cpu']} ({m['cpu_count']} cores, {m['mem_total_gib']} GiB), "
                     f"{record['torch_threads']} torch threads, torch {record['versions']['torch']}, 1-minute load "
                     f"average {load:.1f} at the start; `{record['command']}`."
                     + (f" {record['note']}." if record.get("note") else ""))
    record = runs[0]
    text = [f"Time: {record['timing_method']} calls. Memory: {record['memory_method']} "
            "(`benchmarks/results/divergence_cpu.json`).", *notes]
    return "\n".join(lines) + "\n\n" + "\n\n".join(wrap_paragraph(p) for p in text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=4096, help="tokens")
    parser.add_argument("--d", type=int, default=896, help="hidden size")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--reps", type=int, default=3, help="timed rounds (median reported)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--threads", type=int, help="torch threads (else torch's default)")
    parser.add_argument("--note", default=None, help="a note stored in the results JSON")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="the folder of divergence_cpu.json (default: "
                        "the committed results/)")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        mode, *names = args.worker
        if mode == "memory":
            result = memory_worker(names[0], args.n, args.d, args.vocab, args.threads)
        else:
            result = time_worker(names, args.n, args.d, args.vocab, args.reps, args.threads)
        print(json.dumps(result))
        return
    record = results_record(NAME, run(args), packages=("torch", "transformers", "trl", "seedfast"))
    path = save(record, str(args.n), args.out / f"{NAME}.json")
    print(f"wrote runs[{str(args.n)!r}] of {path}")


def save(record: dict, key: str, path: Path) -> Path:
    """Put one run's record at runs[key] (its N) of the results file, the other runs kept."""
    return update_json_atomic(path, ("runs", key), record, base={"benchmark": NAME, "runs": {}})


if __name__ == "__main__":
    main()
