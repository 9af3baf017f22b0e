"""Asynchronous against synchronous RL, like for like (issue #46, point 6): every cell of engine × environment delay ×
seed runs both loops with the same config, seed and total threads, one after the other in one process, so each
cell's ratio compares two runs on the same box at the same hour (docs/architecture.md, 'Asynchronous rollouts').

    python -m benchmarks.async_grid --policy runs/demo_cpu/sft --games-dir runs/demo_cpu/games        # own engine
    .venv-vllm/bin/python -m benchmarks.async_grid ... --engines own vllm-eager vllm-compiled          # with vLLM

Engines: `own` (the own KV-cache engine), `vllm-eager` (vLLM with `rollout.vllm_enforce_eager=true`: no
torch.compile) and `vllm-compiled` (vLLM as it ships: compiled). The vLLM engines need vLLM's CPU build
(`.venv-vllm`, `make test-vllm`); asked for without it, the script stops before running anything. Delays: seconds
added to every environment step (`env.step_delay_s`; 0 = TextWorld's own cost, which the script measures first).
Threads: both loops run with this process's intra-op threads (`--threads`, default torch's: the cores); the
synchronous loop uses all of them, the asynchronous one gives its producer half (`async_rollout.split_threads`), so
neither side has more cores. The order alternates within a cell (synchronous first in even cells, asynchronous first
in odd ones) so that a drift of the box's speed over the run falls on both sides.

Per run: updates per minute over the training loop (the sum of `time/step`; update 0 of an asynchronous run holds the
producer's start, so the rate after the first update is given too) and pool success per update. Writes
benchmarks/results/<name>.json (machine, versions, threads and every cell's per-update records) and <name>.png, and
prints a table.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import torch

from benchmarks.async_rollout import measure_env_step, overlap_bound, run_mode, summarize
from benchmarks.common import RESULTS_DIR, print_table, write_results
from seedfast.config import load_config
from seedfast.train.async_rollout import split_threads

ROOT = Path(__file__).resolve().parents[1]
ENGINES = {
    "own": ["rollout.engine=own"],
    "vllm-eager": ["rollout.engine=vllm", "rollout.vllm_enforce_eager=true"],
    "vllm-compiled": ["rollout.engine=vllm", "rollout.vllm_enforce_eager=false"],
}


def cells(engines: list[str], delays: list[float], seeds: list[int]) -> list[dict]:
    """The grid in run order: engine, then delay, then seed; `async_first` alternates from cell to cell."""
    return [{"engine": e, "delay_s": d, "seed": s, "async_first": i % 2 == 1}
            for i, (e, d, s) in enumerate(itertools.product(engines, delays, seeds))]


def cell_summary(sync_rows: list[dict], async_rows: list[dict]) -> dict:
    """One cell's two runs side by side: each mode's summary, the speed ratios (asynchronous / synchronous) and the
    paired difference in pool success."""
    sync, stale = summarize("synchronous", sync_rows), summarize("asynchronous", async_rows)
    share, bound = overlap_bound(sync_rows)
    after = (stale["updates_per_min_after_first"] / sync["updates_per_min_after_first"]
             if sync["updates_per_min_after_first"] and stale["updates_per_min_after_first"] else None)
    return {"synchronous": sync, "asynchronous": stale,
            "speedup": stale["updates_per_min"] / sync["updates_per_min"], "speedup_after_first": after,
            "rollout_share": share, "overlap_bound": bound,
            "success_difference": stale["pool_success_mean"] - sync["pool_success_mean"]}


def check_engines(engines: list[str]) -> None:
    """Stop before any run when a vLLM engine is asked for and vLLM cannot be imported here."""
    if any(e.startswith("vllm") for e in engines):
        try:
            import vllm  # noqa: F401
        except ImportError as err:
            raise SystemExit(f"--engines {' '.join(engines)}: vLLM is not importable in this Python ({err}); run "
                             "with .venv-vllm/bin/python (make test-vllm builds it)") from None


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_s) = plt.subplots(1, 2, figsize=(11, 4))
    labels = sorted({(c["engine"], c["delay_s"]) for c in result["cells"]})
    for x, (engine, delay) in enumerate(labels):
        mine = [c for c in result["cells"] if (c["engine"], c["delay_s"]) == (engine, delay)]
        ax_r.scatter([x] * len(mine), [c["summary"]["speedup"] for c in mine], color="C0")
        ax_s.scatter([x] * len(mine), [c["summary"]["success_difference"] for c in mine], color="C1")
    for ax, title, base in ((ax_r, "updates per minute, asynchronous / synchronous", 1.0),
                            (ax_s, "pool success, asynchronous − synchronous (mean per update)", 0.0)):
        ax.axhline(base, color="gray", lw=1)
        ax.set_xticks(range(len(labels)), [f"{e}\n+{1000 * d:.0f} ms/step" for e, d in labels])
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    fig.suptitle(f"one point per seed; {result['threads']['total']} threads each side "
                 f"(asynchronous: {result['threads']['trainer']} trainer + {result['threads']['producer']} producer)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "demo_cpu.yaml")
    p.add_argument("--policy", type=Path, default=ROOT / "runs" / "demo_cpu" / "sft", help="the SFT start (HF)")
    p.add_argument("--games-dir", type=Path, default=ROOT / "runs" / "demo_cpu" / "games")
    p.add_argument("--engines", nargs="+", default=["own"], choices=sorted(ENGINES))
    p.add_argument("--delays", nargs="+", type=float, default=[0.0, 0.05], help="seconds added to each env step")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--steps", type=int, default=16, help="updates per run")
    p.add_argument("--staleness", type=int, default=1, help="the asynchronous runs' rollout.max_staleness")
    p.add_argument("--algorithm", default="grpo")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads of each loop (default: torch's)")
    p.add_argument("--name", default="async_grid", help="results/<name>.json and .png")
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "async_grid", help="the runs' folders")
    p.add_argument("--set", nargs="*", default=[], help="more config overrides (key=value), for every run")
    args = p.parse_args(argv)
    if not (args.policy / "config.json").is_file():
        p.error(f"--policy {args.policy}: no HF folder; make the demo's SFT start first")
    check_engines(args.engines)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    total = torch.get_num_threads()
    trainer_threads, producer_threads = split_threads(total)
    # the start as model.path (an HF folder), not trainer.init_from: vLLM loads the policy from model.path, and
    # every engine starts the same way
    base = [f"model.path={args.policy}", f"env.games_dir={args.games_dir}", f"algorithm={args.algorithm}",
            f"trainer.steps={args.steps}", "trainer.eval_every=0", "trainer.eval_games=1", "trainer.eval_repeats=1",
            "trainer.checkpoint_every=0", "log.progress=false", "log.tensorboard=false", *args.set]
    env = measure_env_step(load_config(args.config, base), games=4, steps=8)
    print(f"TextWorld step: {1000 * env['env_step_s_mean']:.2f} ms mean over {env['env_steps_timed']} steps")
    done = []
    for i, cell in enumerate(cells(args.engines, args.delays, args.seeds)):
        overrides = [*base, *ENGINES[cell["engine"]], f"run.seed={cell['seed']}",
                     f"env.step_delay_s={cell['delay_s']}"]
        work = args.work / args.name / f"cell{i}"
        order = [("asynchronous", args.staleness), ("synchronous", 0)]
        if not cell["async_first"]:
            order.reverse()
        runs = {}
        for mode, staleness in order:
            runs[mode] = run_mode(args.config, overrides, staleness, work)
            torch.set_num_threads(total)  # each run starts from the same threads, whatever the last one left
        done.append({**cell, "overrides": overrides, "summary": cell_summary(runs["synchronous"],
                                                                             runs["asynchronous"]), "runs": runs})
        s = done[-1]["summary"]
        print(f"cell {i}: {cell['engine']} +{cell['delay_s']} s seed {cell['seed']}: {s['speedup']:.2f}x, success "
              f"{s['success_difference']:+.3f}")
    result = {"config": {"config": str(args.config), "policy": str(args.policy), "steps": args.steps,
                         "staleness": args.staleness, "algorithm": args.algorithm, "engines": args.engines,
                         "delays_s": args.delays, "seeds": args.seeds},
              "threads": {"total": total, "trainer": trainer_threads, "producer": producer_threads},
              "env": env, "cells": done}
    path = write_results(args.name, result)
    plot(result, RESULTS_DIR / f"{args.name}.png")
    rows = [{"engine": c["engine"], "delay_ms": 1000 * c["delay_s"], "seed": c["seed"],
             "sync_upm": c["summary"]["synchronous"]["updates_per_min"],
             "async_upm": c["summary"]["asynchronous"]["updates_per_min"], "speedup": c["summary"]["speedup"],
             "bound": c["summary"]["overlap_bound"], "success_diff": c["summary"]["success_difference"]}
            for c in done]
    print_table(rows, list(rows[0]), title=f"{path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
