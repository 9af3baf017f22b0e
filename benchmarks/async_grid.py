"""Asynchronous against synchronous RL, like for like (issue #46, point 6): every cell of engine × environment delay ×
seed runs both loops with the same config, seed and total threads, one after the other in one process, so each
cell's ratio compares two runs on the same box at the same hour (docs/architecture.md, 'Asynchronous rollouts').

    python -m benchmarks.async_grid --policy runs/demo_cpu/sft --games-dir runs/demo_cpu/games        # own engine
    .venv-vllm/bin/python -m benchmarks.async_grid ... --engines own vllm-eager vllm-compiled          # with vLLM

Engines: `own` (the own KV-cache engine), `vllm-eager` (vLLM with `rollout.vllm_enforce_eager=true`: no
torch.compile) and `vllm-compiled` (vLLM as it ships: compiled). Every run is a process of its own (a fresh start for
each side): the own engine's under this Python, vLLM's under vLLM's CPU build (`.venv-vllm`, `make test-vllm`);
asked for without it, the script stops before running anything. Delays: seconds
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
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import RESULTS_DIR, print_table, wrap_paragraph, write_results
from benchmarks.rollout import VLLM_ENV, VLLM_PYTHON
from seedfast.config import load_config
from seedfast.runtime.setup import load_tasks
from seedfast.train.async_rollout import split_threads
from seedfast.train.rl import Trainer

ROOT = Path(__file__).resolve().parents[1]
ENGINES = {
    "own": ["rollout.engine=own"],
    "vllm-eager": ["rollout.engine=vllm", "rollout.vllm_enforce_eager=true"],
    "vllm-compiled": ["rollout.engine=vllm", "rollout.vllm_enforce_eager=false"],
}
ENGINE_WORDS = {"own": "own engine", "vllm-eager": "vLLM eager", "vllm-compiled": "vLLM compiled"}
# the per-update records each run keeps
PER_UPDATE = ("train/success_rate", "time/step", "time/rollout", "time/rollout_wait", "time/update",
              "rollout/staleness_mean", "async/push_seconds")


def measure_env_step(cfg, games: int, steps: int) -> dict:
    """Seconds per TextWorld step on `games` training games, `steps` actions each (the admissible ones in turn)."""
    from seedfast.envs.textworld_env import TextWorldEnv

    times: list[float] = []
    for task in load_tasks(cfg, "train")[:games]:
        env = TextWorldEnv(task.spec)
        obs = env.reset()
        for i in range(steps):
            action = obs.admissible_actions[i % len(obs.admissible_actions)] if obs.admissible_actions else "look"
            t = time.perf_counter()
            obs, _, done, _ = env.step(action)
            times.append(time.perf_counter() - t)
            if done:
                obs = env.reset()
        env.close()
    return {"env_step_s_mean": statistics.fmean(times), "env_step_s_median": statistics.median(times),
            "env_steps_timed": len(times)}


def run_mode(config: Path, overrides: list[str], staleness: int, run_dir: Path) -> list[dict]:
    cfg = load_config(config, [*overrides, f"rollout.max_staleness={staleness}", f"run.out_dir={run_dir}",
                               f"run.name=s{staleness}"])
    trainer = Trainer(cfg)
    try:
        history = trainer.run()
    finally:
        trainer.close()
    return [{"step": r["step"], **{k: r[k] for k in PER_UPDATE if k in r}} for r in history]


def summarize(name: str, rows: list[dict]) -> dict:
    loop_s = sum(r["time/step"] for r in rows)
    steady_s = sum(r["time/step"] for r in rows[1:])  # update 0 of the asynchronous run waits for the producer's start
    success = [r["train/success_rate"] for r in rows]
    return {"mode": name, "updates": len(rows), "loop_s": loop_s, "updates_per_min": 60 * len(rows) / loop_s,
            "updates_per_min_after_first": 60 * (len(rows) - 1) / steady_s if len(rows) > 1 else None,
            "s_per_update": loop_s / len(rows), "pool_success_mean": statistics.fmean(success),
            "pool_success_last4": statistics.fmean(success[-4:]),
            "wait_s_mean": statistics.fmean(r.get("time/rollout_wait", 0.0) for r in rows)}


def overlap_bound(rows: list[dict]) -> tuple[float, float]:
    """From the synchronous run (the first update left out): the rollout's share r of an update, and the speed-up
    a perfect overlap of the rollout with the rest of the update would give, 1 / max(r, 1 - r)."""
    later = rows[1:] or rows
    share = sum(r["time/rollout"] for r in later) / sum(r["time/step"] for r in later)
    return share, 1 / max(share, 1 - share)


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


def python_for(engine: str) -> Path | str:
    return sys.executable if engine == "own" else VLLM_PYTHON


def check_engines(engines: list[str], vllm_python: Path = VLLM_PYTHON) -> None:
    """Stop before any run when a vLLM engine is asked for and vLLM's venv is not there."""
    if any(e.startswith("vllm") for e in engines) and not Path(vllm_python).exists():
        raise SystemExit(f"--engines {' '.join(engines)}: no vLLM venv at {vllm_python}; make test-vllm builds it")


def run_in_process(engine: str, config: Path, overrides: list[str], staleness: int, run_dir: Path, threads: int,
                   timeout_s: float) -> list[dict]:
    """One run (run_mode) in a process of its own, under the engine's Python, with `threads`."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), **({} if engine == "own" else VLLM_ENV)}
    argv = [str(python_for(engine)), "-m", __spec__.name, "--worker", json.dumps(
        {"config": str(config), "overrides": overrides, "staleness": staleness, "run_dir": str(run_dir),
         "threads": threads})]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s,
                          cwd=Path(__file__).resolve().parents[1])
    if proc.returncode != 0:
        raise RuntimeError(f"{engine} run (max_staleness={staleness}) failed ({proc.returncode}):\n"
                           f"{proc.stderr[-6000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def worker(spec: str) -> None:
    """The worker side of run_in_process: the run's per-update rows, as the last line of stdout."""
    job = json.loads(spec)
    torch.set_num_threads(job["threads"])
    rows = run_mode(Path(job["config"]), job["overrides"], job["staleness"], Path(job["run_dir"]))
    print(json.dumps(rows))


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_s) = plt.subplots(1, 2, figsize=(13, 4.5))
    labels = sorted({(c["engine"], c["delay_s"]) for c in result["cells"]})
    for x, (engine, delay) in enumerate(labels):
        mine = [c for c in result["cells"] if (c["engine"], c["delay_s"]) == (engine, delay)]
        ax_r.scatter([x] * len(mine), [c["summary"]["speedup"] for c in mine], color="C0")
        ax_s.scatter([x] * len(mine), [c["summary"]["success_difference"] for c in mine], color="C1")
    for ax, title, base in ((ax_r, "updates per minute, asynchronous / synchronous", 1.0),
                            (ax_s, "pool success, asynchronous − synchronous (mean per update)", 0.0)):
        ax.axhline(base, color="gray", lw=1)
        ax.set_xticks(range(len(labels)), [f"{ENGINE_WORDS[e]}\n+{1000 * d:.0f} ms" for e, d in labels],
                      fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    fig.suptitle(f"one point per seed; {result['threads']['total']} threads each side "
                 f"(asynchronous: {result['threads']['trainer']} trainer + {result['threads']['producer']} producer)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def repeated_curves(cells_: list[dict]) -> str:
    """A sentence where cells repeat each other's learning curves (the same seed drawing the same episodes at every
    delay, or two engines sampling the same tokens), so the success column holds fewer independent pairs than
    cells; "" where every cell's pair is its own."""
    def key(c: dict) -> tuple[int, float]:
        return c["seed"], round(c["summary"]["success_difference"], 9)

    distinct = {key(c) for c in cells_}
    if len(distinct) == len(cells_):
        return ""
    by_engine: dict[str, set] = {}
    for c in cells_:
        by_engine.setdefault(c["engine"], set()).add(key(c))
    same_delay = all(len({k for k in keys if k[0] == s}) == 1 for keys in by_engine.values() for s, _ in keys)
    groups: dict[frozenset, list[str]] = {}
    for engine, keys in by_engine.items():
        groups.setdefault(frozenset(keys), []).append(ENGINE_WORDS[engine])
    twins = [" and ".join(g) for g in groups.values() if len(g) > 1]
    why = ([" at a seed the episodes were the same whatever the delay"] if same_delay else []) + [
        f" {t} drew the same ones" for t in twins]
    return (f" The success column holds {len(distinct)} distinct pairs of learning curves in {len(cells_)} cells:"
            + ";".join(why) + ".")


def trainer_cost(cells_: list[dict], threads: dict) -> str:
    """A sentence on what the split costs the trainer: the update's own time (`time/update`, the first update left
    out) in each loop, means over the cells, and the cells where the asynchronous loop was the slower."""
    def update_s(rows: list[dict]) -> float:
        return statistics.fmean(r.get("time/update", 0.0) for r in rows[1:] or rows)

    sync = statistics.fmean(update_s(c["runs"]["synchronous"]) for c in cells_)
    stale = statistics.fmean(update_s(c["runs"]["asynchronous"]) for c in cells_)
    slower = [c for c in cells_ if c["summary"]["speedup"] < 1]
    text = (f" The update itself (`time/update`) took {sync:.2f} s in the synchronous loop and {stale:.2f} s in the "
            f"asynchronous one (means over the cells), its trainer having {threads['trainer']} of the "
            f"{threads['total']} threads")
    if slower:
        where = sorted({(ENGINE_WORDS[c["engine"]], c["delay_s"]) for c in slower})
        share = statistics.fmean(c["summary"]["rollout_share"] for c in slower)
        text += ("; where the rollout is a small share of a synchronous update ("
                 + ", ".join(f"{e} +{1000 * d:.0f} ms" for e, d in where)
                 + f": r = {share:.2f}), the overlap saves less than that costs, and the asynchronous loop is the "
                 "slower")
    return text + "."


def markdown(result: dict) -> str:
    """The read-out of results/<name>.json for docs/architecture.md, 'Asynchronous rollouts' (`make docs`)."""
    machine, threads, cfg = result["machine"], result["threads"], result["config"]
    cells_ = result["cells"]
    lines = [wrap_paragraph(
        f"Measured (`benchmarks/results/{result['benchmark']}.json` and `.png`, `{result['command']}`): the demo's SFT "
        f"start and pool, {cfg['algorithm'].upper()}, {cfg['steps']} updates a run, one-step-off "
        f"(`rollout.max_staleness={cfg['staleness']}`) against the synchronous loop at the same seed, each run a "
        f"process of its own, on {machine.get('cpu', '?')} ({machine.get('cpu_count', '?')} cores): both loops with "
        f"{threads['total']} intra-op threads, the asynchronous one split {threads['trainer']} trainer + "
        f"{threads['producer']} producer; {len(cells_)} of {result['cells_planned']} planned cells. A TextWorld step "
        f"costs {1000 * result['env']['env_step_s_mean']:.1f} ms; the slower environment adds the delay named."), "",
        "| engine | env delay (ms) | seed | sync updates/min | async updates/min | async / sync | after update 0 "
        "| overlap bound | pool success sync | async − sync |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells_:
        s = c["summary"]
        after = s["speedup_after_first"]
        lines.append(f"| {ENGINE_WORDS[c['engine']]} | {1000 * c['delay_s']:.0f} | {c['seed']} | "
                     f"{s['synchronous']['updates_per_min']:.2f} | {s['asynchronous']['updates_per_min']:.2f} | "
                     f"{s['speedup']:.2f}x | {'-' if after is None else f'{after:.2f}x'} | "
                     f"{s['overlap_bound']:.2f}x | {s['synchronous']['pool_success_mean']:.3f} | "
                     f"{s['success_difference']:+.3f} |")
    groups: dict[tuple[str, float], list[dict]] = {}
    for c in cells_:
        groups.setdefault((c["engine"], c["delay_s"]), []).append(c["summary"])
    means = "; ".join(
        f"{ENGINE_WORDS[e]} +{1000 * d:.0f} ms: {statistics.fmean(x['speedup'] for x in g):.2f}x "
        f"(success {statistics.fmean(x['success_difference'] for x in g):+.3f})"
        for (e, d), g in groups.items())
    pairs = repeated_curves(cells_)
    trainer = trainer_cost(cells_, threads)
    distinct = sorted({round(c["summary"]["success_difference"], 9) for c in cells_})
    signs = (f" Pool success was lower one-step-off in every one of the {len(distinct)} distinct pairs"
             if all(d < 0 for d in distinct) else
             f" Pool success one-step-off minus synchronous ranged over [{distinct[0]:+.3f}, {distinct[-1]:+.3f}]")
    lines += ["", wrap_paragraph(
        f"Mean over the seeds, asynchronous / synchronous updates per minute (and the paired difference in pool "
        f"success per update): {means}.{trainer}{pairs}{signs} (paired runs on the same draws, not a test). The "
        "overlap bound is 1 / max(r, 1 − r) with r the rollout's share of a synchronous update: what a perfect "
        "overlap would give where the producer had cores of its own; here the two processes share the same cores. "
        "A prediction, not a measurement: where the producer has devices of its own (`rollout.devices`), the same "
        "bound holds with that cluster's own rollout share r, so the gain is largest where rollout and training take "
        "about the same time (r = 0.5: 2x) and small where either dominates.")]
    return "\n".join(lines)


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
    p.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
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
    planned = cells(args.engines, args.delays, args.seeds)
    done: list[dict] = []
    result = {"config": {"config": str(args.config), "policy": str(args.policy), "steps": args.steps,
                         "staleness": args.staleness, "algorithm": args.algorithm, "engines": args.engines,
                         "delays_s": args.delays, "seeds": args.seeds},
              "threads": {"total": total, "trainer": trainer_threads, "producer": producer_threads},
              "env": env, "cells_planned": len(planned), "cells": done}
    for i, cell in enumerate(planned):
        overrides = [*base, *ENGINES[cell["engine"]], f"run.seed={cell['seed']}",
                     f"env.step_delay_s={cell['delay_s']}"]
        work = args.work / args.name / f"cell{i}"
        order = [("asynchronous", args.staleness), ("synchronous", 0)]
        if not cell["async_first"]:
            order.reverse()
        runs = {mode: run_in_process(cell["engine"], args.config, overrides, staleness, work, total, args.timeout)
                for mode, staleness in order}
        done.append({**cell, "overrides": overrides, "summary": cell_summary(runs["synchronous"],
                                                                             runs["asynchronous"]), "runs": runs})
        # written after every cell (the file says how many of the planned cells it holds): a grid cut short keeps
        # what it measured
        path = write_results(args.name, result)
        plot(result, RESULTS_DIR / f"{args.name}.png")
        s = done[-1]["summary"]
        print(f"cell {i}: {cell['engine']} +{cell['delay_s']} s seed {cell['seed']}: {s['speedup']:.2f}x, success "
              f"{s['success_difference']:+.3f}", flush=True)
    rows = [{"engine": c["engine"], "delay_ms": 1000 * c["delay_s"], "seed": c["seed"],
             "sync_upm": c["summary"]["synchronous"]["updates_per_min"],
             "async_upm": c["summary"]["asynchronous"]["updates_per_min"], "speedup": c["summary"]["speedup"],
             "bound": c["summary"]["overlap_bound"], "success_diff": c["summary"]["success_difference"]}
            for c in done]
    print_table(rows, list(rows[0]), title=f"{path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
