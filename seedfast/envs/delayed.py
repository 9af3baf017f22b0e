"""An environment slower than its game: every step sleeps `delay_s` after the game's own step (env.step_delay_s).

It plays the step cost of a slower environment (a bigger game, a web or tool environment) with the same game, so
the benchmark of asynchronous rollouts (benchmarks/async_grid.py) and its tests can give the rollout the weight
it has in such runs. The factory is a picklable object, so worker processes (envs/workers.py) build it too. The slots
of one process step one after another, so a batch step costs the delay once per slot of the busiest process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from seedfast.envs.base import Environment, Observation


class DelayedEnv:
    """`env` with `delay_s` seconds added to every step."""

    def __init__(self, env: Environment, delay_s: float) -> None:
        self.env = env
        self.delay_s = float(delay_s)

    def reset(self) -> Observation:
        return self.env.reset()

    def step(self, action: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        out = self.env.step(action)
        time.sleep(self.delay_s)
        return out

    def close(self) -> None:
        self.env.close()

    def __getattr__(self, name: str) -> Any:  # what a game offers beyond the protocol (walkthroughs, ...)
        return getattr(self.env, name)


@dataclass(frozen=True)
class DelayedFactory:
    """`factory(spec)` wrapped in a DelayedEnv; a plain dataclass of a class and a float, so it pickles."""

    factory: Callable[[Any], Environment]
    delay_s: float

    def __call__(self, spec: Any) -> DelayedEnv:
        return DelayedEnv(self.factory(spec), self.delay_s)
