"""Text in, text out through the policy: chat template -> token ids -> generation engine -> text.

Used where the policy itself writes (SEED's self-analysis, GRSD reflections and guidance). The engine is
the rollout engine's protocol; nothing here imports it (rollout imports skills), only the SamplingParams it takes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from seedfast.sampling_params import SamplingParams

Messages = list[dict[str, str]]
_END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


class GenerationEngine(Protocol):
    def generate(self, prompt_token_lists: list[list[int]], params: SamplingParams) -> list[list[int]]: ...


def chat_prompt_ids(tokenizer: Any, messages: Messages) -> list[int]:
    """Token ids of `messages` with the assistant turn opened (transformers 4.x and 5.x return types)."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    if ids and isinstance(ids[0], (list, tuple)):
        ids = ids[0]
    return [int(i) for i in ids]


def default_stop_ids(tokenizer: Any) -> list[int]:
    """The tokenizer's end-of-sequence id(s) plus the end-of-turn token of common chat templates."""
    eos = tokenizer.eos_token_id
    stops = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    vocab = tokenizer.get_vocab()
    stops += [vocab[token] for token in _END_OF_TURN_TOKENS if token in vocab]
    if not stops:
        raise ValueError("the tokenizer has no eos_token_id and no known end-of-turn token: pass stop_ids")
    return sorted(set(stops))


def decode_completion(tokenizer: Any, ids: Sequence[int], stop_ids: Sequence[int]) -> str:
    """Text of generated ids up to (not including) the first stop id."""
    stops = set(stop_ids)
    cut = next((i for i, t in enumerate(ids) if t in stops), len(ids))
    return tokenizer.decode(list(ids[:cut]), skip_special_tokens=True)


@dataclass
class Completion:
    """One generation: the ids as the engine produced them (kept for losses on them) and their text."""

    prompt_ids: list[int]
    completion_ids: list[int]  # up to and including the first stop id, if one came
    text: str  # decoded without the stop id and special tokens


def generate_completions(engine: GenerationEngine, tokenizer: Any, prompts: list[list[int]], max_new_tokens: int,
                         temperature: float = 0.0, top_p: float = 1.0,
                         stop_ids: Sequence[int] | None = None) -> list[Completion]:
    """One completion per prompt; temperature 0 is greedy."""
    if not prompts:
        return []
    stops = list(stop_ids) if stop_ids is not None else default_stop_ids(tokenizer)
    outputs = engine.generate(prompts, SamplingParams(max_new_tokens, temperature, top_p, stops))
    if len(outputs) != len(prompts):
        raise RuntimeError(f"the engine returned {len(outputs)} completions for {len(prompts)} prompts")
    completions = []
    for prompt, out in zip(prompts, outputs):
        out = [int(t) for t in out]
        cut = next((i for i, t in enumerate(out) if t in set(stops)), None)
        kept = out if cut is None else out[: cut + 1]
        completions.append(Completion(list(prompt), kept, decode_completion(tokenizer, kept, stops)))
    return completions


def generate_texts(engine: GenerationEngine, tokenizer: Any, prompts: list[list[int]], max_new_tokens: int,
                   temperature: float = 0.0, top_p: float = 1.0,
                   stop_ids: Sequence[int] | None = None) -> list[str]:
    """The texts of `generate_completions`."""
    return [c.text for c in generate_completions(engine, tokenizer, prompts, max_new_tokens, temperature, top_p,
                                                 stop_ids)]
