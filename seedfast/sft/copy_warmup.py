"""A copy-task warm-up for a decoder trained from scratch: random token strings, each followed by itself.

An agent reads its task: it copies an object's name from the task or the admissible commands into its
action. A transformer does that with induction heads (attend to the token after the previous occurrence of
the current one, copy it). Behaviour cloning alone does not grow them in a from-scratch model: a copy target
is one or two tokens in a few hundred, and the demo's SFT policy without this warm-up read neither directions
nor names. A pure copy task grows them as a phase change in its loss: measured for hidden 128, at ~500 steps
with 2 layers, ~700 with 3, not within 1,200 with 4. So `sft.copy_warmup_steps` steps of this task run before
SFT (docs/demo.md, "A copy-task warm-up that forms induction heads within the budget"). The
strings are drawn uniformly from the tokenizer's ordinary tokens: no game text, nothing of the held-out games.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from seedfast.runtime.optim import grad_norm_and_clip
from seedfast.runtime.precision import MasterWeights
from seedfast.seeds import copy_warmup_seed
from seedfast.sft.examples import SFTExample
from seedfast.sft.loop import Sharding, step_loss_backward


def copy_example(rng: random.Random, token_ids: Sequence[int], length: int, gap: int, source: str) -> SFTExample:
    """A string of `length` tokens, `gap` filler tokens, the string again; the loss is on the repeat (its first
    token excluded: nothing says where the repeat starts)."""
    string = [rng.choice(token_ids) for _ in range(length)]
    filler = [rng.choice(token_ids) for _ in range(gap)]
    start = length + gap
    mask = [False] * (start + 1) + [True] * (length - 1)
    return SFTExample(string + filler + string, mask, "copy", source, answer_start=start)


def copy_examples(token_ids: Sequence[int], tokens: int, *, seed: int = 0, length: tuple[int, int] = (4, 24),
                  gap: tuple[int, int] = (0, 48)) -> list[SFTExample]:
    """Copy-task examples of about `tokens` tokens in all, lengths and gaps drawn uniformly from the ranges."""
    if len(token_ids) < 2:
        raise ValueError(f"copy examples need at least 2 token ids to draw from, got {len(token_ids)}")
    if not 2 <= length[0] <= length[1] or not 0 <= gap[0] <= gap[1]:
        raise ValueError(f"copy examples: need 2 <= length low <= high and 0 <= gap low <= high, got "
                         f"length={length}, gap={gap}")
    rng, pool = random.Random(seed), list(token_ids)
    examples, total = [], 0
    while total < tokens:
        example = copy_example(rng, pool, rng.randint(*length), rng.randint(*gap), f"copy {len(examples)}")
        examples.append(example)
        total += len(example.input_ids)
    return examples


def copy_warmup(model: torch.nn.Module, token_ids: Sequence[int], steps: int, *, lr: float = 2e-3,
                batch_tokens: int = 2048, seed: int = 0,
                log_fn: Callable[[dict[str, Any]], None] | None = None,
                sharding: Sharding | None = None, masters: MasterWeights | None = None) -> float | None:
    """`steps` AdamW steps of the copy task on `model` (a seedfast Decoder), each on fresh examples of about
    `batch_tokens` tokens; returns the last loss (mean NLL of the repeated tokens), None when steps is 0. The
    optimizer is local: SFT starts its own afterwards. With `masters` (runtime/precision.py), `model` is their
    module that computes and the optimizer steps the master weights.

    With `sharding` (the model sharded, as SFT runs after it), every rank draws the same examples and trains on
    its share of each step, its loss the share of the global mean (sft/loop.py), so the warm-up equals the
    one-process warm-up and the ranks end with the same weights."""
    if steps <= 0:
        return None
    trained = masters.master if masters is not None else model
    optimizer = torch.optim.AdamW([p for p in trained.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    if masters is not None:
        masters.attach(optimizer)
    was_training = model.training
    model.train()
    loss_value = None
    try:
        for step in range(steps):
            examples = copy_examples(token_ids, batch_tokens, seed=copy_warmup_seed(seed, step))
            optimizer.zero_grad(set_to_none=True)
            loss_value = step_loss_backward(model, examples, range(len(examples)), sharding=sharding).loss
            grad_norm_and_clip(optimizer, 1.0)
            optimizer.step()
            if log_fn is not None:
                log_fn({"event": "copy_warmup", "step": step + 1, "loss": loss_value})
    finally:
        model.train(was_training)
    return loss_value
