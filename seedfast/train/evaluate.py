"""Evaluation on held-out games: success rate, reward, episode length, invalid-action rate.

The `seedfast eval` command (seedfast/app/evaluate.py) runs `evaluate` on a run's exported policy.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from seedfast.config import Config
from seedfast.rollout.agent_loop import Task, run_agent_loop
from seedfast.rollout.own_engine import Sampler
from seedfast.runtime.setup import agent_config, make_env_slots


def evaluate(cfg: Config, model: torch.nn.Module, tokenizer: Any, tasks: list[Task], *, seed: int,
             temperature: float | None = None, envs: Any = None) -> dict[str, float]:
    """One trajectory per task at the eval temperature (0 = greedy); returns eval/* metrics."""
    temperature = cfg.rollout.eval_temperature if temperature is None else temperature
    was_training = model.training
    model.eval()
    own_envs = envs is None
    envs = envs or make_env_slots(cfg, min(len(tasks), cfg.env.slots or len(tasks)))
    try:
        engine = Sampler(model, seed=seed)
        result = run_agent_loop(engine, tokenizer, tasks, envs, agent_config(cfg, n=1, temperature=temperature))
    finally:
        if own_envs:
            envs.close()
        model.train(was_training)
    return summarize(result.trajectories, result.stats.as_dict(), prefix="eval/")


def summarize(trajectories: list, stats: dict[str, float], prefix: str) -> dict[str, float]:
    n = max(len(trajectories), 1)
    return {
        f"{prefix}success_rate": sum(t.won for t in trajectories) / n,
        f"{prefix}episode_length": sum(len(t.steps) for t in trajectories) / n,
        f"{prefix}invalid_rate": stats.get("invalid_rate", 0.0),
        f"{prefix}env_errors": float(stats.get("env_errors", 0)),
    }


def random_policy_success(cfg: Config, tasks: list[Task], seed: int) -> float:
    """The floor: uniformly random admissible commands, one episode per task, up to env.max_steps."""
    rng = random.Random(seed)
    envs = make_env_slots(cfg, 1)
    wins = 0
    try:
        for task in tasks:
            obs = envs.reset({0: task.spec})[0]
            for _ in range(cfg.env.max_steps):
                if isinstance(obs, str) or not obs.admissible_actions:
                    break
                obs, _, done, info = envs.step({0: rng.choice(obs.admissible_actions)})[0]
                if done:
                    wins += bool(info.get("won"))
                    break
    finally:
        envs.close()
    return wins / max(len(tasks), 1)
