"""The draws of an RL update that the trainer (rl.py) and the asynchronous rollout producer (async_rollout.py) make
alike: the global RNGs from the step's seed, the fixed task pool, each update's tasks.

Apart from rl.py because rl.py starts the producer: the producer reads these from here, never from rl.py.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from seedfast.rollout.agent_loop import Task
from seedfast.seeds import task_choice_seed, task_pool_seed


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def task_pool(tasks: list[Task], size: int | None, seed: int) -> list[Task]:
    """The fixed RL pool: `size` of `tasks` chosen with `seed` (all of them when size is None)."""
    if size is None or size >= len(tasks):
        return list(tasks)
    idx = np.random.default_rng(task_pool_seed(seed)).choice(len(tasks), size=size, replace=False)
    return [tasks[i] for i in sorted(idx)]


def choose_tasks(pool: list[Task], k: int, seed: int, step: int) -> list[Task]:
    """Update `step`'s `k` tasks from the pool, drawn with (run.seed `seed`, step) alone: the same on every rank."""
    rng = np.random.default_rng(task_choice_seed(seed, step))
    idx = rng.choice(len(pool), size=min(k, len(pool)), replace=False)
    return [pool[i] for i in sorted(idx)]
