"""CPU benchmark of seedfast.ops against materialized logits (and Liger-Kernel's chunked GRPO loss).

    python -m benchmarks.logprob_cpu                 # N=4096, d=512, V=32768, fp32, torch's default threads
    python -m benchmarks.logprob_cpu --threads 1     # the same on one thread
    python -m benchmarks.logprob_cpu --n 512 --reps 2 --out /tmp/lp.json   # a quick look
    pip install -e ".[bench]"                        # the Liger-Kernel peer (on CPU: --no-deps, triton is there)

One file, results/logprob_cpu.json, holds a run per thread count: {"benchmark": "logprob_cpu", "runs": {"1": <run>,
"2": <run>}} (a --frozen run: key "<threads>_frozen"). A run rewrites only its own entry.

Each variant runs forward + backward in two fresh processes: one measures the peak resident memory
above the inputs (glibc's mmap threshold pinned, so freed tiles go back to the OS and cannot hide in
the allocator), the other the median wall time of `--reps` calls after a warm-up. Variants:
- logprob: per-token log-probs, random upstream gradient. naive = logits → log_softmax → gather.
- loss_grpo: PPO clip + dual clip + k3 KL (token-mean). naive = the materialized log-probs fed to
  seedfast.algo.losses.total_loss; liger = LigerFusedLinearGRPOLoss (loss_type "dapo", beta = KL coef).
- loss_seed: the same plus the entropy bonus and the gated OPD term (entropy needed: one more pass).
- *_frozen (--frozen): ours with a frozen LM head (weight.requires_grad False, hidden trainable), beside
  *_frozen_before, the same call with the backend made to compute dW anyway (as before need_weight_grad:
  autograd dropped it); time_vs_before is their ratio, measured in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
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
    time_reps,
    update_json_atomic,
)

VARIANTS = ("naive_logprob", "ours_logprob", "naive_loss_grpo", "ours_loss_grpo", "liger_loss_grpo",
            "naive_loss_seed", "ours_loss_seed")
FROZEN_VARIANTS = ("ours_logprob_frozen_before", "ours_logprob_frozen", "ours_loss_grpo_frozen_before",
                   "ours_loss_grpo_frozen")
SEQ_LEN = 512
GRPO = {"kl_coef": 0.01, "kl_kind": "low_var_kl"}
SEED = {**GRPO, "entropy_coef": 0.001, "opd_coef": 0.01, "opd_beta": 5.0, "gate": "gap"}
MALLOC_PINNED = {"MALLOC_MMAP_THRESHOLD_": "131072"}
NAME = "logprob_cpu"
RESULTS = RESULTS_DIR / f"{NAME}.json"
# Liger compiles only its small per-token loss math with torch.compile; its GEMMs run eagerly either way.
LIGER_COMPILED = False


def make_inputs(n: int, d: int, vocab: int, seed: int = 0) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed)
    batch = max(1, n // SEQ_LEN)
    seq = n // batch
    n = batch * seq
    return {
        "hidden": (torch.randn(n, d, generator=gen) / d ** 0.5).requires_grad_(),
        "weight": (torch.randn(vocab, d, generator=gen) * 2.0).requires_grad_(),
        "targets": torch.randint(0, vocab, (n,), generator=gen),
        "upstream": torch.randn(n, generator=gen),
        "old_logprob": -torch.rand(n, generator=gen) * 8.0 - 6.0,
        "ref_logprob": -torch.rand(n, generator=gen) * 8.0 - 6.0,
        "teacher_logprob": -torch.rand(n, generator=gen) * 8.0 - 5.0,
        "advantages": torch.randn(batch, generator=gen),
        "mask": torch.ones(batch, seq, dtype=torch.bool),
    }


@contextlib.contextmanager
def dw_always():
    """The torch backend as it was before need_weight_grad: dW is computed even for a frozen head."""
    from seedfast.ops import chunked

    saved = {name: getattr(chunked, name) for name in ("backward", "fused_forward_backward")}

    def forced(fn):
        return lambda *args, **kwargs: fn(*args, **{**kwargs, "need_weight_grad": True})

    try:
        for name, fn in saved.items():
            setattr(chunked, name, forced(fn))
        yield
    finally:
        for name, fn in saved.items():
            setattr(chunked, name, fn)


def make_forward(variant: str, x: dict):
    """A closure computing the variant's scalar (loss, or log-probs · upstream) with its autograd graph."""
    import torch

    from seedfast.algo import losses
    from seedfast.ops import LossOptions, fused_loss, linear_logprob

    if "_frozen" in variant:  # a frozen LM head: only hidden gets a gradient
        x["weight"].requires_grad_(False)
        variant = variant.split("_frozen")[0]
    hidden, weight, targets = x["hidden"], x["weight"], x["targets"]
    batch, seq = x["mask"].shape
    per_token_adv = x["advantages"][:, None].expand(batch, seq).reshape(-1)
    token_weights = losses.aggregation_weights(x["mask"], "token-mean").reshape(-1)
    loss_options = LossOptions(**(SEED if variant.endswith("seed") else GRPO))

    def naive_logprob(with_entropy: bool):
        logp = torch.log_softmax(hidden @ weight.t(), dim=-1)
        picked = logp.gather(1, targets.unsqueeze(1)).squeeze(1)
        entropy = -(logp.exp() * logp).sum(-1) if with_entropy else None
        return picked, entropy

    def naive_loss():
        lp, entropy = naive_logprob(variant.endswith("seed"))
        extra = {"entropy": entropy.view(batch, seq), "teacher_logprob": x["teacher_logprob"].view(batch, seq)} \
            if entropy is not None else {}
        loss, _ = losses.total_loss(lp.view(batch, seq), x["old_logprob"].view(batch, seq), x["advantages"],
                                    x["mask"], ref_logprob=x["ref_logprob"].view(batch, seq), **extra,
                                    options=loss_options)
        return loss

    def ours_loss():
        extra = {"teacher_logprob": x["teacher_logprob"]} if variant.endswith("seed") else {}
        loss, _ = fused_loss(hidden, weight, targets, token_weights=token_weights, advantages=per_token_adv,
                             old_logprob=x["old_logprob"], ref_logprob=x["ref_logprob"], **extra,
                             options=loss_options)
        return loss

    if variant == "naive_logprob":
        forward = lambda: (naive_logprob(False)[0] * x["upstream"]).sum()
    elif variant == "ours_logprob":
        forward = lambda: (linear_logprob(hidden, weight, targets).logprob * x["upstream"]).sum()
    elif variant.startswith("naive_loss"):
        forward = naive_loss
    elif variant.startswith("ours_loss"):
        forward = ours_loss
    elif variant == "liger_loss_grpo":
        forward = _liger_forward(x, batch, seq)
    else:
        raise ValueError(f"unknown variant {variant!r}")
    return forward


def make_step(variant: str, x: dict):
    """A closure running forward + backward once (and dropping the gradients afterwards)."""
    forward = make_forward(variant, x)
    mode = dw_always if variant.endswith("_before") else contextlib.nullcontext

    def step():
        with mode():
            forward().backward()
        x["hidden"].grad = None
        x["weight"].grad = None

    return step


def _liger_forward(x: dict, batch: int, seq: int):
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

    d = x["hidden"].shape[1]
    loss_fn = LigerFusedLinearGRPOLoss(beta=GRPO["kl_coef"], compiled=LIGER_COMPILED, use_ref_model=True,
                                       loss_type="dapo", epsilon_low=0.2, epsilon_high=0.2)

    def forward():
        loss, _ = loss_fn(x["hidden"].view(batch, seq, d), x["weight"], x["targets"].view(batch, seq),
                          x["mask"], x["advantages"], ref_per_token_logps=x["ref_logprob"].view(batch, seq),
                          old_per_token_logps=x["old_logprob"].view(batch, seq))
        return loss

    return forward


def worker(variant: str, mode: str, n: int, d: int, vocab: int, reps: int, threads: int | None) -> dict:
    import torch

    if threads:
        torch.set_num_threads(threads)
    x = make_inputs(n, d, vocab)
    step = make_step(variant, x)
    step()  # warm-up at full size (first-touch, thread pools, lazy initialisation)
    gc.collect()
    if mode == "memory":
        with PeakRSS() as mem:
            step()
        grads = sum(t.numel() * t.element_size() for t in (x["hidden"], x["weight"]) if t.requires_grad)
        return {"peak_extra_bytes": mem.extra_bytes, "grad_bytes": grads, "memory_method": mem.method}
    wall, cpu = [], []
    for _ in range(reps):
        cpu_start = time.process_time()
        wall += time_reps(step, 1, warmup=0)
        cpu.append(time.process_time() - cpu_start)
    # CPU seconds (all threads) are reported beside wall time: on a shared machine they are far less
    # sensitive to other processes' load than wall time.
    return {"seconds": wall, "median_s": median(wall), "cpu_seconds": cpu, "median_cpu_s": median(cpu),
            "torch_threads": torch.get_num_threads()}


def liger_status() -> str | None:
    """The Liger-Kernel version if its chunked GRPO loss imports here, else None."""
    try:
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure to import means "not available" on this machine
        return None
    from benchmarks.common import versions

    return versions("liger-kernel")["liger-kernel"] or "unknown"


def run_key(threads: int, frozen: bool) -> str:
    """The entry of results/logprob_cpu.json a run writes: its torch thread count, "_frozen" for --frozen."""
    return f"{threads}{'_frozen' if frozen else ''}"


def save(record: dict, key: str, path: Path = RESULTS) -> Path:
    """Put one run's record at runs[key] of the results file, the other runs kept."""
    return update_json_atomic(path, ("runs", key), record, base={"benchmark": NAME, "runs": {}})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=4096, help="tokens (sequences of 512)")
    parser.add_argument("--d", type=int, default=512, help="hidden size")
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--reps", type=int, default=3, help="timed calls per variant (median reported)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS + FROZEN_VARIANTS)
    parser.add_argument("--frozen", action="store_true", help="run the frozen-head variants (after and before "
                        "skipping dW) instead; entry runs[\"<threads>_frozen\"]")
    parser.add_argument("--rounds", type=int, default=1, help="timing processes per variant, interleaved "
                        "(medians over all their calls)")
    parser.add_argument("--note", default=None, help="a note stored in the results JSON (e.g. the machine's load)")
    parser.add_argument("--tile-bytes", type=int, help="SEEDFAST_OPS_TILE_BYTES for our variants (else the default)")
    parser.add_argument("--threads", type=int, help="torch threads per variant (else torch's default); 1 gives "
                        "steadier numbers on a machine that other jobs share")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the results file to put the run in (default: "
                        "the committed one)")
    parser.add_argument("--worker", nargs=2, metavar=("VARIANT", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        print(json.dumps(worker(*args.worker, args.n, args.d, args.vocab, args.reps, args.threads)))
        return

    if args.frozen:
        args.variants = list(FROZEN_VARIANTS)
    load_at_start = list(os.getloadavg())
    liger = liger_status()
    logits_bytes = args.n * args.vocab * 4
    common = ["--n", str(args.n), "--d", str(args.d), "--vocab", str(args.vocab), "--reps", str(args.reps)]
    if args.threads:
        common += ["--threads", str(args.threads)]
    rows = []
    env = {"SEEDFAST_OPS_TILE_BYTES": str(args.tile_bytes)} if args.tile_bytes else {}
    for variant in args.variants:
        row = {"variant": variant}
        if variant.startswith("liger") and liger is None:
            row["note"] = "not available (liger_kernel does not import)"
            rows.append(row)
            continue
        mem = run_worker(["-m", __spec__.name, *common, "--worker", variant, "memory"], env={**env, **MALLOC_PINNED})
        timing = run_worker(["-m", __spec__.name, *common, "--worker", variant, "time"], env=env)
        extra = mem["peak_extra_bytes"] - mem["grad_bytes"]
        row.update(timing, **mem, extra_beyond_grads_bytes=extra,
                   peak_extra_mib=mem["peak_extra_bytes"] / 2**20, extra_beyond_grads_mib=extra / 2**20,
                   extra_over_logits=extra / logits_bytes)
        rows.append(row)
        print(f"  {variant}: {row['median_s']:.2f} s, +{row['peak_extra_mib']:.0f} MiB", file=sys.stderr)
    # More timing processes per variant, round-robin and in reverse order every other round, so that a
    # change in the machine's load during the run falls on all variants alike.
    measured = [r for r in rows if "median_s" in r]
    for round_ in range(1, args.rounds):
        for row in measured[::-1] if round_ % 2 else measured:
            timing = run_worker(["-m", __spec__.name, *common, "--worker", row["variant"], "time"], env=env)
            row["seconds"] += timing["seconds"]
            row["cpu_seconds"] += timing["cpu_seconds"]
            row["median_s"], row["median_cpu_s"] = median(row["seconds"]), median(row["cpu_seconds"])

    by_name = {r["variant"]: r for r in rows}
    for r in rows:
        base = by_name.get("naive_" + r["variant"].split("_", 1)[1])
        if base and "median_s" in r and "median_s" in base:
            r["time_vs_naive"] = r["median_s"] / base["median_s"]
            r["cpu_vs_naive"] = r["median_cpu_s"] / base["median_cpu_s"]
        before = by_name.get(r["variant"] + "_before")
        if r["variant"].endswith("_frozen") and before and "median_s" in r and "median_s" in before:
            r["time_vs_before"] = r["median_s"] / before["median_s"]
            r["cpu_vs_before"] = r["median_cpu_s"] / before["median_cpu_s"]
    print_table(rows, ["variant", "median_s", "time_vs_naive", "time_vs_before", "median_cpu_s", "cpu_vs_naive",
                       "cpu_vs_before", "peak_extra_mib", "extra_beyond_grads_mib", "extra_over_logits", "note"],
                title=f"forward+backward, N={args.n} d={args.d} V={args.vocab} fp32 CPU, "
                      f"threads={args.threads or 'default'}; materialized logits = {logits_bytes / 2**20:.0f} MiB")
    import torch

    from seedfast.ops import tiles

    budget = args.tile_bytes or tiles.DEFAULT_TILE_BYTES
    key = run_key(args.threads or torch.get_num_threads(), args.frozen)  # the workers' count: the same default
    path = save(results_record(NAME, {
        "tiling": {"budget_bytes": budget,
                   "tile_rows_cols": tiles.tile_shape(args.n, args.vocab, args.d, False, budget),
                   "tile_rows_cols_with_entropy": tiles.tile_shape(args.n, args.vocab, args.d, False, budget, 2),
                   "fused_single_pass_rows": tiles.fused_rows(args.n, args.vocab, False, budget)},
        "shapes": {"n": args.n, "d": args.d, "vocab": args.vocab, "seq_len": SEQ_LEN, "dtype": "float32"},
        "logits_bytes": logits_bytes,
        "loss_options": {"grpo": GRPO, "seed": SEED},
        "liger_kernel": liger or "not available",
        "liger_compiled": LIGER_COMPILED,
        "targets": {"extra_over_logits_max": 1 / 16, "logprob_time_vs_naive_max": 1.2,
                    "loss_time_vs_naive_max": 1.0},
        "rounds": args.rounds,
        "loadavg_1_5_15_at_start": load_at_start,
        "note": args.note,
        "results": rows,
    }, packages=("torch", "triton", "transformers", "liger-kernel")), key, args.out)
    print(f"wrote runs[{key!r}] of {path}")


if __name__ == "__main__":
    main()
