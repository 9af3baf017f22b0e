"""The demo's jobs after SFT, run side by side: the SFT policy's held-out evaluation, each algorithm's RL run and
the no-learning control need only the SFT checkpoint, so `demo.lanes` child processes run them at once, each with
its share of the CPUs and its own environment pool (docs/demo.md, "Where the time goes: the 10-minute budget").

Why processes: the demo's decoder is tiny, and its ops use two threads poorly (one copy-task step on the 2-core box:
112 ms with two threads, 176 ms with one, and two one-thread processes side by side 178 ms each: 1.26x the work
done); a lane also computes while the other waits on its environments. A lane dies with the demo, whatever ended it
(envs/lifeline.py), and takes its environment workers with it.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from concurrent.futures import as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seedfast.config import Config
from seedfast.envs.lifeline import OwnedProcessPool
from seedfast.runtime.paths import RunPaths
from seedfast.runtime.setup import device_of, env_slot_count, load_policy, load_run_tokenizer, make_env_slots
from seedfast.train.evaluate import evaluate_policy, evaluation_tasks, random_policy_success
from seedfast.train.rl import Trainer

SFT_EVAL = "eval_sft"
CONTROL = "control"


@dataclass
class JobResult:
    name: str
    history: list[dict[str, Any]]  # an RL run's or the control's metrics rows; empty for the SFT evaluation
    evaluation: dict[str, float]  # held-out metrics of the job's final policy (the SFT policy for eval_sft)
    floor: float | None  # the random policy's held-out success (eval_sft only)
    wall_s: float
    started_at: float  # time.time() when its lane began it: the lanes' schedule (demo_summary.json job_start_s)


def job_names(cfg: Config) -> list[str]:
    """Longest first, so that the lanes end together: each algorithm, the control, the SFT evaluation."""
    return [*cfg.demo.algorithms, CONTROL, SFT_EVAL]


def start_lanes(cfg: Config, cpus: int) -> OwnedProcessPool:
    """The lanes of run_jobs, their processes started now, each with `cpus // lanes` torch threads. A spawned lane
    imports torch and seedfast before its first job (~6 s on the 2-core Xeon): the demo starts them before SFT,
    whose data phase is single-threaded and leaves a CPU to them (docs/demo.md, "Where the time goes")."""
    lanes = min(cfg.demo.lanes, len(job_names(cfg)))
    pool = OwnedProcessPool(lanes, initializer=torch.set_num_threads, initargs=(max(1, cpus // lanes),))
    for _ in range(lanes):  # a process per submit while none is idle
        pool.submit(_imported)
    return pool


def _imported() -> None:
    """Nothing: a lane unpickles it, which imports this module and everything its jobs need."""


def run_jobs(cfg: Config, sft_dir: Path, cpus: int, on_done: Callable[[JobResult], None] | None = None,
             job: Callable[[Config, str, Path], JobResult] | None = None,
             lanes: OwnedProcessPool | None = None) -> dict[str, JobResult]:
    """Every job of `job_names(cfg)` (`job`, default `run_job`) on `lanes` (default: start_lanes(cfg, cpus)),
    which it shuts down; `on_done(result)` is called in this process as each job ends. A job that fails raises
    here, and the lanes still running end with it."""
    names = job_names(cfg)
    pool = lanes if lanes is not None else start_lanes(cfg, cpus)
    results: dict[str, JobResult] = {}
    try:
        futures = [pool.submit(job or run_job, cfg, name, sft_dir) for name in names]
        for future in as_completed(futures):
            result = future.result()
            results[result.name] = result
            if on_done is not None:
                on_done(result)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)  # the lanes still running end with the demo
        raise
    pool.shutdown()
    return {name: results[name] for name in names}


def run_job(cfg: Config, name: str, sft_dir: Path) -> JobResult:
    """One job in this process, with an environment pool of its own (built once, used by every rollout and
    evaluation of the job)."""
    started, t = time.time(), time.perf_counter()
    sub = copy.deepcopy(cfg)
    sub.log.progress = False  # lanes print side by side: the demo reports each job as it ends
    if name == CONTROL:
        sub.algorithm, sub.loss.kl_coef = "grpo", 0.0  # rollouts only: no reference model needed
    elif name != SFT_EVAL:
        sub.algorithm = name
    sub.trainer.init_from = str(sft_dir)
    episodes = evaluation_tasks(sub, "eval")
    envs = make_env_slots(sub, env_slot_count(sub, len(episodes)))
    try:
        if name == SFT_EVAL:
            policy = load_policy(sub, sft_dir, device_of(sub), trainable=False)
            tokenizer = load_run_tokenizer(sub, sft_dir)
            evaluation = evaluate_policy(sub, policy, tokenizer, "eval", envs=envs)
            held_out = episodes[: len(episodes) // sub.trainer.eval_repeats]  # the list is the games, repeated
            floor = random_policy_success(sub, held_out, seed=sub.run.seed, envs=envs)
            return JobResult(name, [], evaluation, floor, time.perf_counter() - t, started)
        trainer = Trainer(sub, policy_dir=sft_dir, run_dir=RunPaths.of(cfg).sub(name).root, envs=envs)
        try:
            if name == CONTROL:
                return JobResult(name, trainer.control_run(), {}, None, time.perf_counter() - t, started)
            history = trainer.run()
            # the trainer's end-of-run evaluation is evaluate_policy's; a run that ended without one gets it here
            evaluation = ({k: v for k, v in history[-1].items() if k.startswith("eval/")}
                          or evaluate_policy(sub, trainer.policy, trainer.tokenizer, "eval", envs=envs))
            return JobResult(name, history, evaluation, None, time.perf_counter() - t, started)
        finally:
            trainer.close()
    finally:
        envs.close()
