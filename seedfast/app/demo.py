"""`make demo`: the whole pipeline on a CPU with a tiny model, for real.

games (TextWorld, generated offline) → tokenizer + tiny decoder → SFT (behaviour cloning, skill-augmented
prompts, skill writing) → held-out eval of the SFT policy and of a random policy → GRPO and SEED for the same
number of updates from the same SFT checkpoint and seed, plus a no-learning control (the same rollouts, same games
and sampling seeds, with the SFT policy and no update) → held-out eval of each → report.md + report.png.

Held-out success before and after is the evaluation every command shares (train/evaluate.py evaluate_policy:
each held-out game trainer.eval_repeats times, the same seed for every policy): the SFT start's is run here,
each algorithm's is its trainer's end-of-run evaluation, so `seedfast eval` on an exported policy gives the number
the report prints. 32 games played 4 times each showed a held-out fall that 96 more games did not, and one play
of each of 128 games still moves a change by ~0.06 from sampling alone: the demo plays 128 games 4 times
(docs/demo.md, benchmarks/results/generalization_probe.json).
"""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import Any

from seedfast.app.report import EVIDENCE, curve_means, write_json, write_report
from seedfast.config import Config
from seedfast.envs.textworld_games import make_games
from seedfast.runtime.paths import RunPaths
from seedfast.runtime.setup import (
    device_of,
    env_slot_count,
    load_policy,
    load_run_tokenizer,
    load_tasks,
    make_env_slots,
)
from seedfast.sft import run as sft
from seedfast.train.evaluate import evaluate_policy, evaluation_tasks, random_policy_success
from seedfast.train.rl import Trainer


def plays(repeats: int) -> str:
    return "once" if repeats == 1 else f"{repeats} times"


def model_line(cfg: Config, n_params: int) -> str:
    if cfg.model.path:
        return f"{Path(cfg.model.path).name}, {n_params / 1e6:.1f}M parameters, pretrained"
    tiny = cfg.model.tiny
    return (f"Qwen3-style decoder, hidden {tiny.hidden}, {tiny.layers} layers, {n_params / 1e6:.2f}M parameters, "
            "trained from scratch")


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

    t = time.perf_counter()
    sft.main(cfg)
    timings["sft"] = time.perf_counter() - t
    sft_dir = paths.sft
    _say(f"SFT done in {timings['sft']:.0f} s -> {sft_dir}")

    t = time.perf_counter()
    device = device_of(cfg)
    policy = load_policy(cfg, sft_dir, device, trainable=False)
    tokenizer = load_run_tokenizer(cfg, sft_dir)
    episodes = evaluation_tasks(cfg, "eval")
    eval_games = episodes[: len(episodes) // cfg.trainer.eval_repeats]  # the list is the games, repeated
    # one environment pool for every rollout and evaluation below: its workers start once
    envs = make_env_slots(cfg, env_slot_count(cfg, len(episodes)))
    try:
        before = evaluate_policy(cfg, policy, tokenizer, "eval", envs=envs)
        floor = random_policy_success(cfg, eval_games, seed=cfg.run.seed, envs=envs)
        timings["eval_sft"] = time.perf_counter() - t
        _say(f"held-out success: SFT {before['eval/success_rate']:.3f}, random policy {floor:.3f}")

        histories: dict[str, list[dict[str, Any]]] = {}
        after: dict[str, dict[str, float]] = {}
        for algorithm in cfg.demo.algorithms:
            t = time.perf_counter()
            sub = copy.deepcopy(cfg)
            sub.algorithm = algorithm
            sub.trainer.init_from = str(sft_dir)
            trainer = Trainer(sub, policy_dir=sft_dir, run_dir=paths.sub(algorithm).root, envs=envs)
            try:
                histories[algorithm] = trainer.run()
                # the trainer's end-of-run evaluation is evaluate_policy's; a run that ended without one gets it here
                after[algorithm] = ({k: v for k, v in histories[algorithm][-1].items() if k.startswith("eval/")}
                                    or evaluate_policy(cfg, trainer.policy, tokenizer, "eval", envs=envs))
            finally:
                trainer.close()
            timings[algorithm] = time.perf_counter() - t
            _say(f"{algorithm}: {len(histories[algorithm])} updates in {timings[algorithm]:.0f} s, held-out success "
                 f"{after[algorithm]['eval/success_rate']:.3f}")

        t = time.perf_counter()
        sub = copy.deepcopy(cfg)
        sub.algorithm, sub.loss.kl_coef = "grpo", 0.0  # rollouts only: no reference model needed
        control = Trainer(sub, policy_dir=sft_dir, run_dir=paths.sub("control").root, envs=envs)
        try:
            control_history = control.control_run()
        finally:
            control.close()
    finally:
        envs.close()
    timings["control"] = time.perf_counter() - t
    _say(f"no-learning control: {len(control_history)} rollouts in {timings['control']:.0f} s")

    setup = {
        "games": f"{e.game_type} levels {e.levels}: {len(load_tasks(cfg, 'train'))} training, "
                 f"{len(eval_games)} held-out (each played {plays(cfg.trainer.eval_repeats)} per evaluation)",
        "model": model_line(cfg, sum(p.numel() for p in policy.parameters())),
        "RL": f"{cfg.trainer.steps} updates x {cfg.rollout.tasks_per_batch} games x {cfg.rollout.n} trajectories, "
              f"lr {cfg.optim.lr}, seed {cfg.run.seed}, same SFT start for every algorithm",
        "RL pool": (f"a fixed pool of {cfg.rollout.task_pool} training games, drawn again every update "
                    "(success on it measures learning)" if cfg.rollout.task_pool else
                    "fresh draws from every training game (success on it measures transfer)"),
        "skills": f"analyzer={cfg.skill.analyzer}, insertion={cfg.skill.insertion}",
        "total wall time": f"{time.perf_counter() - t_start:.0f} s",
    }
    report = write_report(paths.root, histories, floor=floor, before=before, after=after, timings=timings, setup=setup,
                          control=control_history)
    every = {**histories, "control": control_history}
    curves = {name: [r["train/success_rate"] for r in h] for name, h in every.items()}
    signal = {name: [r.get("train/groups_with_signal") for r in h] for name, h in every.items()}
    write_json(paths.demo_summary, {
        "before": before, "after": after, "random_floor": floor, "timings": timings, "setup": setup,
        "seed": cfg.run.seed, "pool_success": curves, "groups_with_signal": signal,
        "means": {name: curve_means(c) for name, c in curves.items()},
        "seed_metrics": {name: {k: sum(r.get(k, 0.0) for r in h) / len(h) for k in EVIDENCE if any(k in r for r in h)}
                         for name, h in histories.items()}})
    _say(f"report: {report}")
    print(report.read_text())
    return 0
