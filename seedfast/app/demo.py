"""`make demo`: the whole pipeline on a CPU with a tiny model, for real.

games (TextWorld, generated offline) → tokenizer + tiny decoder → SFT (behaviour cloning, skill-augmented
prompts, skill writing) → side by side (app/demo_jobs.py): held-out eval of the SFT policy and of a random policy,
GRPO and SEED for the same number of updates from the same SFT checkpoint and seed, each with its held-out eval,
and a no-learning control (the same rollouts, same games and sampling seeds, with the SFT policy and no update) →
report.md + report.png.

Held-out success before and after is the evaluation every command shares (train/evaluate.py evaluate_policy:
each held-out game trainer.eval_repeats times, the same seed for every policy): the SFT start's is run here,
each algorithm's is its trainer's end-of-run evaluation, so `seedfast eval` on an exported policy gives the number
the report prints. The demo plays its 64 held-out games 4 times each (a held-out change's sampling error is in
docs/demo.md, "Results"; 32 games once showed a fall that 96 more did not, benchmarks/results/
generalization_probe.json).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from seedfast.app.demo_jobs import CONTROL, SFT_EVAL, JobResult, run_jobs, start_lanes
from seedfast.app.host_memory import give_back_freed_memory
from seedfast.app.report import EVIDENCE, curve_means, teacher_shares, write_json, write_report
from seedfast.config import Config
from seedfast.envs.textworld_games import make_games
from seedfast.model import parameter_count
from seedfast.runtime.paths import RunPaths
from seedfast.runtime.setup import load_tasks
from seedfast.sft import run as sft
from seedfast.train.evaluate import evaluation_tasks


def plays(repeats: int) -> str:
    return "once" if repeats == 1 else f"{repeats} times"


def model_line(cfg: Config, n_params: int) -> str:
    if cfg.model.path:
        return f"{Path(cfg.model.path).name}, {n_params / 1e6:.1f}M parameters, pretrained"
    tiny = cfg.model.tiny
    return (f"Qwen3-style decoder, hidden {tiny.hidden}, {tiny.layers} layers, {n_params / 1e6:.2f}M parameters, "
            "trained from scratch")


def _done_line(result: JobResult) -> str:
    if result.name == SFT_EVAL:
        return (f"held-out success of the SFT policy {result.evaluation['eval/success_rate']:.3f}, "
                f"random policy {result.floor:.3f}")
    if result.name == CONTROL:
        return f"{len(result.history)} rollouts"
    return f"{len(result.history)} updates, held-out success {result.evaluation['eval/success_rate']:.3f}"


def sft_events(log: Path) -> dict[str, dict[str, Any]]:
    """SFT log's event rows by event name (data, copy_warmup, done), the last of each."""
    events = {}
    with open(log) as f:
        for line in f:
            row = json.loads(line)
            if "event" in row:
                events[row["event"]] = row
    return events


def sft_phases(log: Path) -> dict[str, float | int]:
    """SFT's wall time by phase, from its log: the data (replays, tokenizer, examples), the copy warm-up (a fixed
    number of steps of fixed shapes: across runs, a gauge of the machine's speed at the time) and the steps."""
    events = sft_events(log)
    warmup = events.get("copy_warmup", {"wall_s": 0.0, "steps": 0})
    return {"data": events["data"]["wall_s"], "copy_warmup": warmup["wall_s"], "copy_warmup_steps": warmup["steps"],
            "steps": events["done"]["elapsed_s"]}


def _say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main(cfg: Config, **_: Any) -> int:
    t_start = time.perf_counter()
    paths = RunPaths.of(cfg)
    paths.root.mkdir(parents=True, exist_ok=True)
    cfg.save()
    timings: dict[str, float] = {}

    t = time.perf_counter()
    e = cfg.env
    games = make_games(e.games_dir, e.game_type, e.levels, e.n_train, e.n_eval, seed=e.games_seed,
                       workers=e.workers or os.cpu_count() or 1)
    timings["games"] = time.perf_counter() - t
    _say(f"{len(games)} TextWorld games ({e.game_type}, levels {e.levels}) in {timings['games']:.0f} s")

    lanes = start_lanes(cfg, os.cpu_count() or 1)  # they start during SFT's data phase (app/demo_jobs.py)
    try:
        t = time.perf_counter()
        sft.main(cfg)
        give_back_freed_memory()  # this process trains no more: the lanes do, each with a model of its own
        timings["sft"] = time.perf_counter() - t
        sft_dir = paths.sft
        _say(f"SFT done in {timings['sft']:.0f} s -> {sft_dir}")

        t, t_epoch = time.perf_counter(), time.time()
        eval_games = evaluation_tasks(cfg, "eval")
        eval_games = eval_games[: len(eval_games) // cfg.trainer.eval_repeats]  # the list is the games, repeated
        jobs = run_jobs(cfg, sft_dir, os.cpu_count() or 1,
                        on_done=lambda r: _say(f"{r.name}: {_done_line(r)} in {r.wall_s:.0f} s"), lanes=lanes)
    except BaseException:
        lanes.shutdown(wait=False, cancel_futures=True)  # an error before run_jobs took them: they end now
        raise
    timings["after_sft"] = time.perf_counter() - t
    job_seconds = {name: result.wall_s for name, result in jobs.items()}  # each in its lane: they overlap
    job_start_s = {name: result.started_at - t_epoch for name, result in jobs.items()}  # the lanes' schedule
    _say(f"{len(jobs)} jobs on {min(cfg.demo.lanes, len(jobs))} lanes in {timings['after_sft']:.0f} s")
    before, floor = jobs[SFT_EVAL].evaluation, jobs[SFT_EVAL].floor
    histories = {name: jobs[name].history for name in cfg.demo.algorithms}
    after = {name: jobs[name].evaluation for name in cfg.demo.algorithms}
    control_history = jobs[CONTROL].history

    setup = {
        "games": f"{e.game_type} levels {e.levels}: {len(load_tasks(cfg, 'train'))} training, "
                 f"{len(eval_games)} held-out (each played {plays(cfg.trainer.eval_repeats)} per evaluation)",
        "model": model_line(cfg, parameter_count(sft_dir)),
        "RL": f"{cfg.trainer.steps} updates x {cfg.rollout.tasks_per_batch} games x {cfg.rollout.n} trajectories, "
              f"lr {cfg.optim.lr}, seed {cfg.run.seed}, same SFT start for every algorithm",
        "RL pool": (f"a fixed pool of {cfg.rollout.task_pool} training games, drawn again every update "
                    "(success on it measures learning)" if cfg.rollout.task_pool else
                    "fresh draws from every training game (success on it measures transfer)"),
        "skills": f"analyzer={cfg.skill.analyzer}, insertion={cfg.skill.insertion}",
        "total wall time": f"{time.perf_counter() - t_start:.0f} s",
    }
    report = write_report(paths.root, histories, floor=floor, before=before, after=after, timings=timings, setup=setup,
                          control=control_history, job_seconds=job_seconds)
    every = {**histories, "control": control_history}
    curves = {name: [r["train/success_rate"] for r in h] for name, h in every.items()}
    signal = {name: [r.get("train/groups_with_signal") for r in h] for name, h in every.items()}
    write_json(paths.demo_summary, {
        "before": before, "after": after, "random_floor": floor, "timings": timings, "job_seconds": job_seconds,
        "job_start_s": job_start_s, "lanes": min(cfg.demo.lanes, len(jobs)), "setup": setup,
        "held_out": {"games": len(eval_games), "plays": cfg.trainer.eval_repeats},
        "temperatures": {"held_out": cfg.rollout.eval_temperature, "pool": cfg.rollout.temperature},
        "sft_phases": sft_phases(paths.sft_metrics),
        "seed": cfg.run.seed, "pool_success": curves, "groups_with_signal": signal,
        "means": {name: curve_means(c) for name, c in curves.items()},
        "seed_metrics": {name: {k: sum(r.get(k, 0.0) for r in h) / len(h) for k in EVIDENCE if any(k in r for r in h)}
                         for name, h in histories.items()},
        "teacher_share": teacher_shares(histories)})
    _say(f"report: {report}")
    print(report.read_text())
    return 0
