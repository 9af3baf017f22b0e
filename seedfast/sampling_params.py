"""What one generation call samples with, `SamplingParams`: the engines (rollout/engine.py's protocol, the own
sampler, vLLM, the colocated rollouts) and the policy's text writers (skills/policy_text.py) all take it.

A top-level module like seeds.py, so that skills, which rollout imports, can build one too. A SamplingParams is
checked when it is made, so every engine gets valid values and none checks them again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def check_sampling_args(temperature: float, top_p: float) -> None:
    """A sampler's temperature (a finite number >= 0, 0 = greedy) and nucleus top_p (in (0, 1])."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature < math.inf:
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")


def check_scoring_temperature(temperature: object, func: str | None = None) -> float:
    """The temperature a log-prob is taken at, softmax(logits / T): a finite number > 0 (no greedy limit to score
    at; inf would make every token equally likely, NaN every log-prob NaN). The one check of every scoring op and
    pass; `func` names the caller in the error."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < math.inf:
        raise ValueError(f"{func + ': ' if func else ''}temperature must be finite and > 0, got {temperature!r}")
    return float(temperature)


@dataclass(frozen=True)
class SamplingParams:
    """`max_new_tokens` per completion; `temperature` 0 is greedy; `top_p` the nucleus; a completion ends at a
    `stop_ids` token (kept in its output) or after max_new_tokens. `seed`: the call's draws are a function of it and
    the prompts alone, as the first call after the engine was seeded with it; None draws from the engine's own
    stream (rollout/engine.py)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_ids: Sequence[int] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        n = self.max_new_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {n!r}")
        check_sampling_args(self.temperature, self.top_p)
        stops = tuple(self.stop_ids)
        if any(isinstance(t, bool) or not isinstance(t, int) for t in stops):
            raise TypeError(f"stop_ids must be ints, got {list(stops)!r}")
        object.__setattr__(self, "stop_ids", stops)  # a tuple: the params stay frozen
