"""The generation-engine protocol the agent loop and the `self` analyzer talk to.

Seeds: every engine is built with a seed (`Sampler(model, seed=)`, `VLLMEngine(path, seed=)`,
`build_rollout(..., seed=)`; the RL loop's engines are reseeded per step by `begin_step(seed)`), and every
`generate` / `generate_full` takes `seed=` (keyword): the call's draws are then a function of that seed and the
prompts alone, as the first call after the engine was seeded with it; `seed=None` draws from the engine's own
stream. Seeds come from seedfast/seeds.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

FINISH_REASONS = ("stop", "length")


@dataclass(frozen=True)
class Generation:
    """One completion: ids as generated (a final stop id included), their sampling log-probs, why it ended."""

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str  # "stop" (a stop id was generated) or "length" (max_new_tokens reached)


@runtime_checkable
class GenerationEngine(Protocol):
    def generate(
        self,
        prompt_token_lists: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop_ids: Sequence[int] = (),
        *,
        seed: int | None = None,
    ) -> list[list[int]]: ...


def generate_full(
    engine: GenerationEngine,
    prompt_token_lists: Sequence[Sequence[int]],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    stop_ids: Sequence[int] = (),
    *,
    seed: int | None = None,
) -> list[Generation]:
    """`engine.generate_full` when the engine has it; otherwise `generate`, without log-probs. `seed` is passed on
    only when given (the protocol's `seed`)."""
    seeded = {} if seed is None else {"seed": seed}
    if hasattr(engine, "generate_full"):
        return engine.generate_full(prompt_token_lists, max_new_tokens, temperature, top_p, stop_ids, **seeded)
    stops = set(stop_ids)
    outputs = engine.generate(prompt_token_lists, max_new_tokens, temperature, top_p, stop_ids, **seeded)
    return [Generation(list(ids), None, "stop" if ids and ids[-1] in stops else "length") for ids in outputs]
