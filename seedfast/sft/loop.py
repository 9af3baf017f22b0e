"""The SFT training loop: packed varlen batches, NLL through linear_logprob on the loss rows only, AdamW.

    stats = train_sft(model, examples, cfg.sft, seed=0, log_fn=print)

No padding and no [tokens x vocab] logits: the decoder runs over the packed batch, and only the hidden
rows that predict a loss token go through the streamed LM head. Deterministic given the seed (the
shuffle and everything else; the model's own kernels permitting).

Sharded (`sharding`, built by app/sft.py over torchrun's processes, docs/scaling.md): every rank plans the same
steps, trains on its share of each step's examples (whole examples, balanced by tokens) and its loss is its share
of the GLOBAL token-weighted mean (the weight sum all-reduced), so with FSDP2's gradients summed across ranks
(divide factor 1) one optimizer step on N ranks is the one-process step. A rank with no example in a step runs
one at weight 0, so that every rank issues the same collectives.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from seedfast.config import SFTConfig
from seedfast.model.packing import make_cu_seqlens
from seedfast.ops import linear_logprob
from seedfast.runtime.optim import decoupled_adamw, grad_norm_and_clip, lr_at
from seedfast.runtime.precision import MasterWeights
from seedfast.runtime.progress import ProgressBar
from seedfast.sft.examples import EXAMPLE_KINDS, SFTExample


@dataclass
class Sharding:
    """How SFT runs over data-parallel ranks. app/sft.py builds it from seedfast/distributed/ (sft/ does not import it:
    tests/test_import_direction.py), so the loop gets dist's rules as plain callables."""

    dp: Any  # distributed/data.py DataParallel: rank, size, sum(values), max(values) over the data-parallel ranks
    assign: Callable[[Sequence[float], int], list[int]]  # distributed/data.py assign_groups: the rank of each example
    shard: Callable[[torch.nn.Module], torch.nn.Module] | None = None  # parallelize_decoder over the mesh
    full_state: Callable[[torch.nn.Module], dict[str, torch.Tensor]] | None = None  # gathered on rank 0
    is_main: bool = True  # global rank 0: the one process that writes

    def share(self, index: Sequence[int], lengths: Sequence[int]) -> list[int]:
        """This rank's examples of a step's `index` (whole examples, balanced by their `lengths`, one each)."""
        owners = self.assign(lengths, self.dp.size)
        return [i for i, r in zip(index, owners) if r == self.dp.rank]


@dataclass
class SFTStats:
    steps: int
    epochs: float  # passes over the data done (fractional when stopped by the time budget)
    tokens: int  # tokens run through the model
    loss_tokens: int
    first_loss: float | None
    last_loss: float | None
    elapsed_s: float
    stopped_by_time: bool


def check_examples(examples: Sequence[SFTExample], vocab_size: int, batch_tokens: int) -> None:
    """One clear error naming the example that cannot be trained on."""
    if not examples:
        raise ValueError("examples is empty: there is nothing to train on")
    for i, ex in enumerate(examples):
        if not isinstance(ex, SFTExample):
            raise TypeError(f"examples[{i}] must be an SFTExample, got {type(ex).__name__}")
        if ex.n_loss_tokens == 0:
            raise ValueError(f"example {ex.source!r} has no loss token")
        if len(ex.input_ids) > batch_tokens:
            raise ValueError(f"example {ex.source!r} has {len(ex.input_ids)} tokens, more than "
                             f"sft.batch_tokens={batch_tokens}; a sample is never split")
        bad = [t for t in ex.input_ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"example {ex.source!r} holds token id {bad[0]} outside the vocabulary "
                             f"[0, {vocab_size})")


def plan_batches(lengths: Sequence[int], batch_tokens: int, epochs: int,
                 seed: int) -> list[tuple[int, list[int]]]:
    """(epoch, example indices) per optimizer step: each epoch a seeded shuffle, cut at batch_tokens."""
    gen = torch.Generator().manual_seed(seed)
    plan: list[tuple[int, list[int]]] = []
    for epoch in range(epochs):
        batch: list[int] = []
        size = 0
        for i in torch.randperm(len(lengths), generator=gen).tolist():
            if batch and size + lengths[i] > batch_tokens:
                plan.append((epoch, batch))
                batch, size = [], 0
            batch.append(i)
            size += lengths[i]
        if batch:
            plan.append((epoch, batch))
    return plan


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # [T]
    cu_seqlens: torch.Tensor  # [B+1] int32
    rows: torch.Tensor  # [N] hidden rows that predict a loss token
    targets: torch.Tensor  # [N] the tokens they predict
    row_kind: torch.Tensor  # [N] index into EXAMPLE_KINDS
    row_is_answer: torch.Tensor  # [N] bool: the row predicts an answer token (not a prompt token)
    keep_last: list[int]  # per example, its rows from the first loss row on: all the last layer must run
    kept_rows: torch.Tensor  # [N] the loss rows' places among those kept rows


def pack(examples: Sequence[SFTExample], device: torch.device | str) -> PackedBatch:
    ids, rows, targets, kinds, answer, offset = [], [], [], [], [], 0
    keep_last, kept_rows, kept_before = [], [], 0
    for ex in examples:
        ids += ex.input_ids
        first = None
        for t in range(1, len(ex.input_ids)):
            if ex.loss_mask[t]:
                first = t - 1 if first is None else first
                rows.append(offset + t - 1)
                kept_rows.append(kept_before + t - 1 - first)
                targets.append(ex.input_ids[t])
                kinds.append(EXAMPLE_KINDS.index(ex.kind))
                answer.append(t >= ex.answer_start)
        keep_last.append(0 if first is None else len(ex.input_ids) - first)
        kept_before += keep_last[-1]
        offset += len(ex.input_ids)

    def tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    cu_seqlens = make_cu_seqlens([len(e.input_ids) for e in examples], device)
    return PackedBatch(tensor(ids), cu_seqlens, tensor(rows), tensor(targets), tensor(kinds),
                       torch.tensor(answer, dtype=torch.bool, device=device), keep_last, tensor(kept_rows))


def batch_loss(logprob: torch.Tensor, batch: PackedBatch, prompt_weight: float = 1.0,
               total_weight: float | None = None) -> torch.Tensor:
    """Weighted mean NLL of the batch's loss tokens: answer tokens weigh 1, prompt tokens `prompt_weight`.

    With the loss on prompt tokens too (a model learning the language from scratch), the few answer tokens
    of a step are ~3% of the loss; a weight below 1 keeps the prompt's language signal while the actions
    still drive the gradient. `total_weight` (default: this batch's weight sum) is the denominator: on N ranks
    the step's global weight sum, so the ranks' losses add up to the one-process loss (docs/scaling.md)."""
    weights = torch.where(batch.row_is_answer, 1.0, prompt_weight).to(logprob.dtype)
    total = weights.sum().clamp_min(1e-12) if total_weight is None else max(total_weight, 1e-12)
    return -(logprob * weights).sum() / total


def token_logprobs(model: torch.nn.Module, batch: PackedBatch) -> torch.Tensor:
    """[N] log-probs of the batch's loss tokens (differentiable when grad is enabled). The last layer runs the rows
    from each example's first loss row on (model/decoder.py keep_last: a copy task's string, a prompt without loss)."""
    hidden = model(batch.input_ids, batch.cu_seqlens, keep_last=batch.keep_last)[batch.kept_rows]
    return linear_logprob(hidden, model.lm_head_weight, batch.targets).logprob


def _loss_by_kind(logprob: torch.Tensor, kinds: torch.Tensor) -> dict[str, float]:
    sums, counts = _kind_sums(logprob, kinds)
    return _kind_means(sums, counts)


def _kind_sums(logprob: torch.Tensor, kinds: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per example kind: the summed NLL and the token count (added over ranks before the means)."""
    sums = torch.zeros(len(EXAMPLE_KINDS), dtype=torch.float64)
    sums.index_add_(0, kinds.cpu(), -logprob.double().cpu())
    counts = torch.bincount(kinds.cpu(), minlength=len(EXAMPLE_KINDS))
    return sums.tolist(), [float(c) for c in counts.tolist()]


def _kind_means(sums: Sequence[float], counts: Sequence[float]) -> dict[str, float]:
    return {f"loss/{k}": sums[i] / counts[i] for i, k in enumerate(EXAMPLE_KINDS) if counts[i]}


@dataclass
class StepResult:
    """One optimizer step's loss and counts over all ranks."""

    loss: float
    tokens: int  # run through the model (padding excluded)
    loss_tokens: int
    by_kind: dict[str, float]


def step_loss_backward(model: torch.nn.Module, examples: Sequence[SFTExample], index: Sequence[int],
                       prompt_weight: float = 1.0, sharding: Sharding | None = None) -> StepResult:
    """Forward and backward of one optimizer step's examples `index` (gradients accumulate in the parameters).

    With `sharding`, this rank's share of them, its loss the share of the global weighted mean; a rank with no
    example runs the step's first one at weight 0 (same collectives on every rank). The result is global."""
    device = model.lm_head_weight.device
    mine = list(index) if sharding is None else sharding.share(index, [len(examples[i].input_ids) for i in index])
    batch = pack([examples[i] for i in (mine or list(index)[:1])], device)
    logprob = token_logprobs(model, batch)
    total = None
    if sharding is not None:
        local = torch.where(batch.row_is_answer, 1.0, prompt_weight).sum() if mine else torch.zeros(())
        total = sharding.dp.sum([float(local.double())])[0]
    loss = batch_loss(logprob, batch, prompt_weight, total)
    if not mine:
        loss = loss * 0.0
    loss.backward()
    sums, counts = _kind_sums(logprob.detach().float(), batch.row_kind) if mine else (
        [0.0] * len(EXAMPLE_KINDS), [0.0] * len(EXAMPLE_KINDS))
    values = [float(loss.detach()), float(batch.input_ids.numel() if mine else 0),
              float(batch.rows.numel() if mine else 0), *sums, *counts]
    if sharding is not None:
        values = sharding.dp.sum(values)
    k = len(EXAMPLE_KINDS)
    return StepResult(values[0], int(values[1]), int(values[2]), _kind_means(values[3:3 + k], values[3 + k:]))


@torch.no_grad()
def evaluate_loss(model: torch.nn.Module, examples: Sequence[SFTExample],
                  batch_tokens: int) -> dict[str, float]:
    """Mean NLL over all loss tokens ("loss") and per example kind ("loss/<kind>"), no gradient."""
    device = model.lm_head_weight.device
    check_examples(examples, model.lm_head_weight.shape[0], batch_tokens)
    lengths = [len(e.input_ids) for e in examples]
    was_training = model.training
    model.eval()
    try:
        logprobs, kinds = [], []
        for _, index in plan_batches(lengths, batch_tokens, 1, 0):
            batch = pack([examples[i] for i in index], device)
            logprobs.append(token_logprobs(model, batch).float())
            kinds.append(batch.row_kind)
    finally:
        model.train(was_training)
    logprob, kind = torch.cat(logprobs), torch.cat(kinds)
    return {"loss": float(-logprob.double().mean()), **_loss_by_kind(logprob, kind)}


def train_sft(model: torch.nn.Module, examples: Sequence[SFTExample], cfg: SFTConfig, *, seed: int = 0,
              max_seconds: float | None = None, log_fn: Callable[[dict[str, Any]], None] | None = None,
              progress: bool = False, schedule: str | None = None, grad_clip: float | None = 1.0,
              betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
              masters: MasterWeights | None = None, sharding: Sharding | None = None) -> SFTStats:
    """Fine-tune `model` (a seedfast Decoder) on `examples` with cfg (the config's sft section).

    cfg.epochs passes, each a seeded shuffle packed into batches of at most cfg.batch_tokens tokens, one
    AdamW step per batch (lr with cfg.warmup_steps and `schedule`, default cfg.schedule), gradient norm clipped
    to `grad_clip`, AdamW `betas` and `eps`. With `masters` (runtime/precision.py), `model` is their module that
    computes and the optimizer steps the master weights. Stops
    between steps once `max_seconds` (default cfg.max_seconds) have passed. `log_fn` gets one metrics dict per step.

    With `sharding` (a model sharded by sharding.shard; every rank passes the same examples and seed), each
    rank trains on its share of every step (module docstring); the stats and logged metrics are global, and
    the ranks stop on the time budget together (the slowest rank's clock decides).
    """
    schedule = schedule or cfg.schedule
    max_seconds = cfg.max_seconds if max_seconds is None else max_seconds
    check_examples(examples, model.lm_head_weight.shape[0], cfg.batch_tokens)  # a DTensor's shape is global
    plan = plan_batches([len(e.input_ids) for e in examples], cfg.batch_tokens, cfg.epochs, seed)
    per_epoch = [sum(e == epoch for e, _ in plan) for epoch in range(cfg.epochs)]
    place = [i - sum(per_epoch[:e]) + 1 for i, (e, _) in enumerate(plan)]  # steps done in its epoch, incl.
    optimizer = decoupled_adamw(masters.master if masters is not None else model, cfg.lr, cfg.weight_decay,
                                betas=betas, eps=eps)
    if masters is not None:
        masters.attach(optimizer)
    stats = SFTStats(0, 0.0, 0, 0, None, None, 0.0, False)
    bar = ProgressBar(len(plan), "sft") if progress else None
    was_training = model.training
    model.train()
    start = time.perf_counter()
    try:
        for step, (epoch, index) in enumerate(plan):
            if max_seconds is not None:
                over = float(time.perf_counter() - start >= max_seconds)
                if (sharding.dp.max([over])[0] if sharding is not None else over) > 0:
                    stats.stopped_by_time = True
                    break
            lr = lr_at(step, len(plan), cfg.lr, cfg.warmup_steps, schedule)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.zero_grad(set_to_none=True)
            result = step_loss_backward(model, examples, index, cfg.prompt_loss_weight, sharding)
            norm = grad_norm_and_clip(optimizer, grad_clip)
            optimizer.step()

            value = result.loss
            stats.steps, stats.last_loss = step + 1, value
            stats.first_loss = value if stats.first_loss is None else stats.first_loss
            stats.tokens += result.tokens
            stats.loss_tokens += result.loss_tokens
            stats.epochs = epoch + place[step] / per_epoch[epoch]
            stats.elapsed_s = time.perf_counter() - start
            if log_fn is not None:
                log_fn({"step": step + 1, "epoch": round(stats.epochs, 4), "loss": value, "lr": lr,
                        "grad_norm": norm, "tokens": result.tokens, "loss_tokens": result.loss_tokens,
                        "elapsed_s": round(stats.elapsed_s, 3),
                        "tokens_per_s": round(stats.tokens / max(stats.elapsed_s, 1e-9), 1), **result.by_kind})
            if bar is not None:
                bar.advance(f"sft loss {value:.3f}")
    finally:
        if bar is not None:
            bar.close()
    stats.elapsed_s = time.perf_counter() - start
    model.train(was_training)
    return stats

