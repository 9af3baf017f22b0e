"""Evaluation on held-out games: success rate, reward, episode length, invalid-action rate.

`evaluate_policy` is THE evaluation of a run's policy: the `seedfast eval` command (seedfast/app/evaluate.py) and
the trainer's in-loop evaluation (train/rl.py `Trainer._evaluate`) both call it, so one policy, config and run.seed
give one set of numbers: the games of `evaluation_tasks`, the seed of seeds.eval_seed, rollout.eval_temperature, in
chunks. `evaluate` is its engine, also called directly by the demo and the benchmarks on games of their choosing.

Split over data-parallel ranks (`dp`): the games are cut into chunks whose size does not depend on the number of
ranks, chunk k is played with its own seed (seeds.eval_chunk_seed) by rank k mod the ranks, and the counts are
added over the ranks, so N ranks give exactly the metrics one process gets with `dp` of size 1 (docs/scaling.md).
The policy is whole on every rank (no collective inside a chunk: a sharded policy is evaluated under dist's
unsharded()).
"""

from __future__ import annotations

import random
from typing import Any

import torch

from seedfast.config import Config
from seedfast.distributed.data import DataParallel
from seedfast.envs.slots import counter_delta, counters_of
from seedfast.rollout.agent_loop import Task, run_agent_loop
from seedfast.rollout.own_engine import Sampler
from seedfast.runtime.setup import agent_config, load_tasks, make_env_slots
from seedfast.seeds import eval_chunk_seed, eval_seed


def eval_chunk_games(cfg: Config) -> int:
    """Games per chunk of an evaluation: env.slots (one wave of the environments), else one rollout batch's worth
    of trajectories (tasks_per_batch x n), which the run already sized to fit its memory. It depends on the config
    alone, never on the number of ranks, so every world size plays the same chunks."""
    return cfg.env.slots or max(1, cfg.rollout.tasks_per_batch * cfg.rollout.n)


def evaluation_tasks(cfg: Config, split: str = "eval", skipped: list[str] | None = None) -> list[Task]:
    """The episodes an evaluation of `split` plays, in manifest order: the train games (env.n_train), or the
    held-out games (env.n_eval) cut to trainer.eval_games; the list again trainer.eval_repeats times (a sampled
    evaluation's noise falls with the plays; docs/demo.md). ScienceWorld: 'eval' is its dev split (selection),
    'test' its held-out test split."""
    if split not in ("train", "eval", "test"):
        raise ValueError(f"split must be 'train', 'eval' or 'test', got {split!r}")
    tasks = load_tasks(cfg, split, skipped=skipped)  # damaged games: runtime/setup.py (env.damaged_games)
    if split != "train" and cfg.trainer.eval_games:
        tasks = tasks[: cfg.trainer.eval_games]
    return tasks * cfg.trainer.eval_repeats


def evaluate_policy(cfg: Config, model: torch.nn.Module, tokenizer: Any, split: str = "eval", *, envs: Any = None,
                    dp: Any = None) -> dict[str, float]:
    """The evaluation of a run's policy that `seedfast eval` and the in-loop evaluation share (module docstring):
    `evaluation_tasks(cfg, split)`, one trajectory each at rollout.eval_temperature, seeded with
    seeds.eval_seed(run.seed), always in chunks (`evaluate` with `dp`; one process is the rank of a `dp` of size
    1), plus what the environments went through (eval/env_* counters, added over the ranks).

    `envs`: the slots to play in (a run's pool; at least a chunk's games, as env_slot_count gives, so every chunk is
    one wave); default: as many as a chunk's games, made here and closed. Every rank of `dp` must call it."""
    dp = dp if dp is not None else DataParallel(rank=0, size=1)
    skipped: list[str] = []
    tasks = evaluation_tasks(cfg, split, skipped)
    own_envs = envs is None
    if own_envs:
        envs = make_env_slots(cfg, max(1, min(len(tasks), eval_chunk_games(cfg))))
    try:
        before = counters_of(envs)
        metrics = evaluate(cfg, model, tokenizer, tasks, seed=eval_seed(cfg.run.seed), envs=envs, dp=dp)
        moved = counter_delta(before, counters_of(envs), "eval/env_")
    finally:
        if own_envs:
            envs.close()
    if moved:  # every rank's environments
        moved = dict(zip(moved, dp.sum(list(moved.values()))))
    return {**metrics, **moved, "eval/games_skipped": float(len(skipped))}


def evaluate(cfg: Config, model: torch.nn.Module, tokenizer: Any, tasks: list[Task], *, seed: int,
             temperature: float | None = None, envs: Any = None, dp: Any = None,
             chunk_games: int | None = None) -> dict[str, float]:
    """One trajectory per task at the eval temperature (0 = greedy); returns eval/* metrics.

    Without `dp`, all games in one batch, sampled with `seed`. With `dp` (distributed/data.py DataParallel, or anything
    with rank, size and sum(values) over the ranks), the split evaluation of the module docstring: chunks of
    `chunk_games` games (default eval_chunk_games), the same metrics on every rank and for any
    number of ranks; every rank must call it (the counts are all-reduced). `envs` (default: made here and closed;
    a run passes the one it rolls out with) must have the same number of slots on every rank, as the slots cut a
    chunk into waves."""
    temperature = cfg.rollout.eval_temperature if temperature is None else temperature
    if dp is not None:
        return _evaluate_split(cfg, model, tokenizer, tasks, seed, temperature, envs, dp,
                               chunk_games or eval_chunk_games(cfg))
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


def _evaluate_split(cfg: Config, model: torch.nn.Module, tokenizer: Any, tasks: list[Task], seed: int,
                    temperature: float, envs: Any, dp: Any, chunk_games: int) -> dict[str, float]:
    if chunk_games < 1:
        raise ValueError(f"chunk_games must be >= 1, got {chunk_games}")
    chunks = [tasks[i:i + chunk_games] for i in range(0, len(tasks), chunk_games)]
    mine = [k for k in range(len(chunks)) if k % dp.size == dp.rank]
    # trajectories, wins, episode steps, invalid actions, agent-loop steps, environment errors
    counts = [0.0] * 6
    if mine:
        was_training = model.training
        model.eval()
        own_envs = envs is None
        envs = envs or make_env_slots(cfg, min(len(tasks), chunk_games))  # as many slots on every rank
        config = agent_config(cfg, n=1, temperature=temperature)
        try:
            for k in mine:
                engine = Sampler(model, seed=eval_chunk_seed(seed, k))
                result = run_agent_loop(engine, tokenizer, chunks[k], envs, config)
                t, st = result.trajectories, result.stats
                for i, v in enumerate((len(t), sum(x.won for x in t), sum(len(x.steps) for x in t),
                                       st.invalid_actions, st.steps, st.env_errors)):
                    counts[i] += v
        finally:
            if own_envs:
                envs.close()
            model.train(was_training)
    n, won, steps, invalid, loop_steps, errors = dp.sum(counts)
    return {"eval/success_rate": won / max(n, 1), "eval/episode_length": steps / max(n, 1),
            "eval/invalid_rate": invalid / loop_steps if loop_steps else 0.0, "eval/env_errors": float(errors)}


def summarize(trajectories: list, stats: dict[str, float], prefix: str) -> dict[str, float]:
    n = max(len(trajectories), 1)
    return {
        f"{prefix}success_rate": sum(t.won for t in trajectories) / n,
        f"{prefix}episode_length": sum(len(t.steps) for t in trajectories) / n,
        f"{prefix}invalid_rate": stats.get("invalid_rate", 0.0),
        f"{prefix}env_errors": float(stats.get("env_errors", 0)),
    }


def random_policy_success(cfg: Config, tasks: list[Task], seed: int, envs: Any = None) -> float:
    """The floor: uniformly random admissible commands, one episode per task, up to env.max_steps, in slot 0 of
    `envs` (default: one slot made here and closed)."""
    rng = random.Random(seed)
    own_envs = envs is None
    envs = envs or make_env_slots(cfg, 1)
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
        if own_envs:
            envs.close()
    return wins / max(len(tasks), 1)
