"""The generation-engine protocol the agent loop and the `self` analyzer talk to.

Every `generate` / `generate_full` takes the prompts and one `SamplingParams` (seedfast/sampling_params.py): the
token budget, temperature, top-p, stop ids and the call's seed. Seeds: every engine is built with a seed
(`Sampler(model, seed=)`, `VLLMEngine(path, seed=)`, `build_rollout(..., seed=)`; the RL loop's engines are reseeded
per step by `begin_step(seed)`); a call with `SamplingParams(seed=s)` draws as the first call after the engine was
seeded with s, a function of s and the prompts alone; `seed=None` draws from the engine's own stream. Seeds come from
seedfast/seeds.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from seedfast.sampling_params import SamplingParams

FINISH_REASONS = ("stop", "length")


@dataclass(frozen=True)
class Generation:
    """One completion: ids as generated (a final stop id included), their sampling log-probs, why it ended."""

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str  # "stop" (a stop id was generated) or "length" (max_new_tokens reached)


@runtime_checkable
class GenerationEngine(Protocol):
    """What generates: `generate` the completions' token ids, `generate_full` the completions with their sampling
    log-probs (None from an engine that has none) and finish reasons. Every engine has both."""

    def generate(self, prompt_token_lists: Sequence[Sequence[int]], params: SamplingParams) -> list[list[int]]: ...

    def generate_full(self, prompt_token_lists: Sequence[Sequence[int]], params: SamplingParams
                      ) -> list[Generation]: ...
