"""`seedfast collect CONFIG`: SEED stage 1. The config wired to rollout/collect.py's collect_skill_data: the
policy (runtime/setup.py policy_path) on collect.tasks training games x collect.rollouts_per_task trajectories,
labelled by skill.collect_analyzer, written to collect.out (default <run_dir>/collect)."""

from __future__ import annotations

import sys
from typing import Any

from seedfast.config import Config
from seedfast.rollout.agent_loop import Task
from seedfast.rollout.collect import collect_skill_data
from seedfast.runtime.paths import collect_dir
from seedfast.runtime.setup import (
    agent_config,
    build_engine,
    device_of,
    load_run_tokenizer,
    load_tasks,
    make_env_slots,
    policy_path,
)
from seedfast.train.privileged import skill_analyzer


def main(cfg: Config, **_flags: Any) -> int:
    """Entry point of `seedfast collect`."""
    path = policy_path(cfg)  # first: a missing policy fails before any game is made
    tokenizer = load_run_tokenizer(cfg, path)
    engine = build_engine(cfg, path, device_of(cfg))
    tasks = collect_tasks(cfg)
    out_dir = collect_dir(cfg)
    per_batch = min(cfg.rollout.tasks_per_batch or len(tasks), len(tasks))
    envs = make_env_slots(cfg, per_batch * cfg.collect.rollouts_per_task)  # one pool for every batch
    try:
        summary = collect_skill_data(
            engine, tokenizer, tasks, envs, skill_analyzer(cfg, cfg.skill.collect_analyzer, engine, tokenizer),
            out_dir, agent_config(cfg, n=cfg.collect.rollouts_per_task, temperature=cfg.rollout.temperature),
            tasks_per_batch=per_batch, skill_mode=cfg.skill.skill_mode,
        )
    finally:
        envs.close()
    rollout = summary.rollout
    print(f"collected {summary.trajectories} trajectories on {len(tasks)} tasks "
          f"(success {rollout['success_rate']:.1%}, invalid actions {rollout['invalid_rate']:.1%}); "
          f"{summary.kept_pairs} skill pairs kept; reasons {summary.reasons}; -> {summary.out_dir}")
    return 0


def collect_tasks(cfg: Config) -> list[Task]:
    """The first collect.tasks training games of load_tasks (TextWorld games made when missing)."""
    tasks = load_tasks(cfg, "train", generate=True)
    if len(tasks) < cfg.collect.tasks:
        print(f"collect.tasks={cfg.collect.tasks} but only {len(tasks)} training games exist "
              f"(env.n_train{' x levels' if cfg.env.kind == 'textworld' else ''}); using all of them",
              file=sys.stderr)
    return tasks[: cfg.collect.tasks]
