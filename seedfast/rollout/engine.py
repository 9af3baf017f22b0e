"""The generation-engine protocol the agent loop and the `self` analyzer talk to."""

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
    ) -> list[list[int]]: ...


def generate_full(
    engine: GenerationEngine,
    prompt_token_lists: Sequence[Sequence[int]],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    stop_ids: Sequence[int] = (),
) -> list[Generation]:
    """`engine.generate_full` when the engine has it; otherwise `generate`, without log-probs."""
    if hasattr(engine, "generate_full"):
        return engine.generate_full(prompt_token_lists, max_new_tokens, temperature, top_p, stop_ids)
    stops = set(stop_ids)
    outputs = engine.generate(prompt_token_lists, max_new_tokens, temperature, top_p, stop_ids)
    return [Generation(list(ids), None, "stop" if ids and ids[-1] in stops else "length") for ids in outputs]
