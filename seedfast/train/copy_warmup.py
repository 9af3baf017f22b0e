"""A copy-task warm-up for a decoder trained from scratch: random token strings, each followed by itself.

An agent reads its task: it copies an object's name from the task or the admissible commands into its
action. A transformer does that with induction heads (attend to the token after the previous occurrence of
the current one, copy it), and a from-scratch 1M-parameter decoder grows them in about a hundred steps of a
pure copy task. Behaviour cloning alone holds one or two copy targets per few hundred tokens: measured on the
demo's games, 500 steps of it left a made-up object name at 4–8 nats per word piece, i.e. not copied at all.
So `sft.copy_warmup_steps` steps of this task run before SFT (docs/demo.md, "A copy-task warm-up"). The
strings are drawn uniformly from the tokenizer's ordinary tokens: no game text, nothing of the held-out games.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from seedfast.ops import linear_logprob


def copy_batch(token_ids: Sequence[int], batch: int, length: int, generator: torch.Generator
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids [B·2L], cu_seqlens [B+1], rows, targets): B strings of `length` tokens, each repeated once;
    `rows` are the positions that predict a token of a repeat (the first repeated token excluded: nothing
    says where the repeat starts)."""
    pool = torch.as_tensor(list(token_ids), dtype=torch.long)
    strings = pool[torch.randint(len(pool), (batch, length), generator=generator)]
    seqs = torch.cat([strings, strings], dim=1)
    span = 2 * length
    cu_seqlens = torch.arange(0, batch * span + 1, span, dtype=torch.int32)
    starts = torch.arange(batch)[:, None] * span
    rows = (starts + torch.arange(length, span - 1)[None, :]).reshape(-1)
    return seqs.reshape(-1), cu_seqlens, rows, seqs.reshape(-1)[rows + 1]


def copy_warmup(model: torch.nn.Module, token_ids: Sequence[int], steps: int, *, lr: float = 2e-3,
                batch: int = 16, length: int = 32, seed: int = 0,
                log_fn: Callable[[dict[str, Any]], None] | None = None) -> float | None:
    """`steps` AdamW steps of the copy task on `model` (a seedfast Decoder); returns the last loss (mean NLL
    of the repeated tokens), None when steps is 0. The optimizer is local: SFT starts its own afterwards."""
    if steps <= 0:
        return None
    if len(token_ids) < 2:
        raise ValueError(f"copy_warmup needs at least 2 token ids to draw from, got {len(token_ids)}")
    device = model.lm_head_weight.device
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    was_training = model.training
    model.train()
    loss_value = None
    try:
        for step in range(steps):
            ids, cu_seqlens, rows, targets = (t.to(device) for t in copy_batch(token_ids, batch, length, generator))
            hidden = model(ids, cu_seqlens)[rows]
            loss = -linear_logprob(hidden, model.lm_head_weight, targets).logprob.mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            loss_value = float(loss.detach())
            if log_fn is not None:
                log_fn({"event": "copy_warmup", "step": step + 1, "loss": loss_value})
    finally:
        model.train(was_training)
    return loss_value
