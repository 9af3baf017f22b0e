"""The tensor-parallel LM head: log-probs and the fused loss on this rank's rows of the vocabulary.

With `dist.tp > 1` the LM head (and the embedding) is sharded over the vocabulary by distributed/parallelize.py:
a DTensor placed Shard(0) on the tensor-parallel mesh. These functions take that DTensor as it is, run the streamed
log-prob of `seedfast/ops/vocab_parallel.py` on the local rows (max / sum-exp / target / entropy reduced across the
tensor-parallel group) and, for the loss, the per-token formulas of `seedfast/ops/token_loss.py` (the very ones
`fused_loss` uses) on the resulting [N] log-probs. No rank ever holds [tokens x V] logits, nor the full dW: each
rank's weight gradient is its own rows (docs/scaling.md, 'Tensor-parallel LM head').

The own sampler draws from a vocabulary-parallel head with the Gumbel-max trick (`tp_sample_next`): each rank adds
Gumbel noise to its [B, V/tp] logits, and an all-gather of each rank's (best score, its token, its logit) picks the
token: an exact sample from softmax(logits / T), with its log-prob from the group's max and sum-exp. The noise of
global token j comes from fixed tiles of the vocabulary drawn in order, so it does not depend on tp.
`HEAD_OPS` is what distributed/parallelize.py hangs on a tensor-parallel model (`model.head_ops`): scoring and the
sampler take their log-prob and sampling ops from it (they may not import dist: tests/test_import_direction.py).
"""

from __future__ import annotations

from types import ModuleType, SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from seedfast.ops import PLAIN_PPO, LinearLogprobOutput, LossOptions, get_backend
from seedfast.ops.fused_loss import loss_inputs
from seedfast.ops.token_loss import metric_means, needs_entropy
from seedfast.ops.vocab_parallel import vocab_parallel_divergence, vocab_parallel_logprob
from seedfast.sampling_params import check_sampling_args, check_scoring_temperature

NOISE_TILE = 8192  # Gumbel noise is drawn in tiles of this many vocabulary entries, in order


def is_vocab_parallel(weight: torch.Tensor) -> bool:
    """Whether `weight` is an LM head sharded over the vocabulary (a DTensor with Shard(0) on some mesh dim)."""
    return isinstance(weight, DTensor) and any(p == Shard(0) for p in weight.placements)


def local_vocab(weight: DTensor) -> tuple[torch.Tensor, int, Any]:
    """(this rank's rows of W, differentiable; the global id of its first row; the process group over which the
    vocabulary is split)."""
    dims = [i for i, p in enumerate(weight.placements) if p == Shard(0)]
    if len(dims) != 1 or any(p != Shard(0) and not p.is_replicate() for p in weight.placements):
        raise ValueError(f"the LM head must be split over the vocabulary on one mesh dimension (Shard(0)) and "
                         f"replicated on the others, got placements {weight.placements}")
    _, offset = compute_local_shape_and_global_offset(weight.shape, weight.device_mesh, weight.placements)
    return weight.to_local(), int(offset[0]), weight.device_mesh.get_group(dims[0])


def tp_linear_logprob(hidden: torch.Tensor, weight: DTensor, targets: torch.Tensor, *,
                      teacher_hidden: torch.Tensor | None = None, temperature: float = 1.0,
                      with_entropy: bool = False, ignore_index: int = -100,
                      backend: str | ModuleType = "auto") -> LinearLogprobOutput:
    """`seedfast.ops.linear_logprob` for a vocabulary-parallel LM head; hidden, targets (global ids) and
    teacher_hidden are the same on every rank of the tensor-parallel group."""
    local, start, group = local_vocab(weight)
    return vocab_parallel_logprob(hidden, local, targets, start, group=group, teacher_hidden=teacher_hidden,
                                  temperature=temperature, with_entropy=with_entropy, ignore_index=ignore_index,
                                  backend=backend)


class _TokenLoss(torch.autograd.Function):
    """The per-token loss of ops/token_loss.py on [N] log-probs (and entropies): its backward hands out the
    a = ∂L/∂ℓθ and b = ∂L/∂H it computed in forward."""

    @staticmethod
    def forward(ctx, logprob, entropy, backend: ModuleType, per_token: dict, options: LossOptions, extra_out: dict):
        loss, a, b, sums = backend.token_loss(logprob.detach(), None if entropy is None else entropy.detach(),
                                              **per_token, options=options)
        extra_out["sums"] = sums
        ctx.ab = (a, b)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        a, b = ctx.ab
        return a * grad_loss, (None if b is None else b * grad_loss), None, None, None, None


def tp_fused_loss(hidden: torch.Tensor, weight: DTensor, targets: torch.Tensor, *, token_weights: torch.Tensor,
                  advantages: torch.Tensor, old_logprob: torch.Tensor | None,
                  ref_logprob: torch.Tensor | None = None, teacher_logprob: torch.Tensor | None = None,
                  teacher_mask: torch.Tensor | None = None, options: LossOptions = PLAIN_PPO,
                  temperature: float = 1.0, ignore_index: int = -100, backend: str = "auto",
                  return_logprob: bool = False
                  ) -> tuple[torch.Tensor, dict] | tuple[torch.Tensor, dict, torch.Tensor]:
    """`seedfast.ops.fused_loss` (same arguments, same results) for a vocabulary-parallel LM head."""
    func = "tp_fused_loss"
    if not is_vocab_parallel(weight):
        raise TypeError(f"{func}: weight must be a vocabulary-parallel DTensor (Shard(0)); use "
                        "seedfast.ops.fused_loss for a whole LM head")
    if not isinstance(targets, torch.Tensor) or targets.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{func}: targets must be an int64 (or int32) tensor")
    if hidden.dim() != 2 or weight.shape[1] != hidden.shape[1] or targets.shape != hidden.shape[:1]:
        raise ValueError(f"{func}: hidden [N, d], weight [V, d] and targets [N] do not fit: {tuple(hidden.shape)}, "
                         f"{tuple(weight.shape)}, {tuple(targets.shape)}")
    check_scoring_temperature(temperature, func)
    targets = targets.long()
    n, device = hidden.shape[0], hidden.device
    valid = targets != ignore_index
    if bool(((targets < 0) & valid).any()) or bool((targets >= weight.shape[0]).any()):
        raise ValueError(f"{func}: targets must lie in [0, {weight.shape[0]}) or be ignore_index={ignore_index}")
    per_token, options = loss_inputs(
        func, targets, ignore_index, n, device, token_weights=token_weights, advantages=advantages,
        old_logprob=old_logprob, ref_logprob=ref_logprob, teacher_logprob=teacher_logprob, teacher_mask=teacher_mask,
        options=options)
    impl = get_backend(backend, device)
    out = tp_linear_logprob(hidden, weight, targets, temperature=temperature,
                            with_entropy=needs_entropy(options), ignore_index=ignore_index,
                            backend=impl)
    extra: dict = {}
    loss = _TokenLoss.apply(out.logprob, out.entropy, impl, per_token, options, extra)
    metrics = metric_means(extra["sums"])
    metrics["loss"] = loss.detach()
    if return_logprob:
        return loss, metrics, out.logprob.detach()
    return loss, metrics


def tp_fused_divergence(hidden: torch.Tensor, teacher_hidden: torch.Tensor, weight: DTensor, *,
                        token_weights: torch.Tensor, kind: str = "reverse_kl", beta: float = 0.5,
                        temperature: float = 1.0, backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """`seedfast.ops.fused_divergence` (same arguments, same results) for a vocabulary-parallel LM head."""
    if not is_vocab_parallel(weight):
        raise TypeError("tp_fused_divergence: weight must be a vocabulary-parallel DTensor (Shard(0)); use "
                        "seedfast.ops.fused_divergence for a whole LM head")
    local, _, group = local_vocab(weight)
    return vocab_parallel_divergence(hidden, local, teacher_hidden, token_weights=token_weights, kind=kind, beta=beta,
                                     temperature=temperature, group=group, backend=backend)


def gumbel_noise(rows: int, vocab: int, start: int, stop: int, generator: torch.Generator,
                 device: torch.device) -> torch.Tensor:
    """Gumbel(0, 1) noise [rows, stop - start] for the global vocabulary entries [start, stop): the whole vocabulary's
    noise is drawn tile by tile (NOISE_TILE columns, in order) and only the overlap is kept, so every rank of any
    tensor-parallel degree sees the same noise for the same token, and no tensor is larger than a tile."""
    out = torch.empty(rows, stop - start, device=device)
    tiny = torch.finfo(torch.float32).tiny
    for lo in range(0, vocab, NOISE_TILE):
        hi = min(lo + NOISE_TILE, vocab)
        u = torch.rand(rows, hi - lo, generator=generator, device=device)
        a, b = max(lo, start), min(hi, stop)
        if a < b:
            out[:, a - start:b - start] = -torch.log(-torch.log(u[:, a - lo:b - lo].clamp_min(tiny)))
    return out


def tp_sample_next(hidden: torch.Tensor, weight: DTensor, temperature: float, top_p: float = 1.0,
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`seedfast.rollout.sampling.sample_next` for a vocabulary-parallel LM head, from last hidden states [B, d]
    (the same on every rank of the group): (tokens [B] int64, log-probs [B] fp32 under softmax(logits / T) over the
    whole vocabulary; greedy when temperature is 0, its log-prob at temperature 1). Sampling is Gumbel-max, an exact
    draw from the distribution (not the same random stream as the one-process sampler's multinomial). Each rank
    holds its [B, V / tp] logits only; top_p < 1 is refused (the nucleus needs a global sort)."""
    check_sampling_args(temperature, top_p)
    if top_p != 1.0:
        raise ValueError(f"top_p={top_p}: a vocabulary-parallel head samples the full distribution only "
                         "(set rollout.top_p=1.0, or dist.tp=1)")
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be [B, d], got shape {tuple(hidden.shape)}")
    local, start, group = local_vocab(weight)
    z = (hidden @ local.detach().T).float()
    if temperature > 0:
        z = z / temperature
    rows = z.shape[0]
    m = z.max(dim=1).values if z.shape[1] else z.new_full((rows,), float("-inf"))
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    sum_exp = (z - m[:, None]).exp().sum(dim=1)
    dist.all_reduce(sum_exp, group=group)
    log_norm = m + sum_exp.log()
    score = z
    if temperature > 0:
        if generator is None:
            raise ValueError("tp_sample_next: sampling (temperature > 0) needs a generator (the same seed on every "
                             "rank of the group)")
        score = z + gumbel_noise(rows, weight.shape[0], start, start + z.shape[1], generator, z.device)
    best, arg = score.max(dim=1)  # the first maximum, as torch.argmax
    mine = torch.stack([best, z.gather(1, arg[:, None]).squeeze(1), (arg + start).to(z.dtype)], dim=1)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine.contiguous(), group=group)
    cand = torch.stack(every)  # [ranks, B, 3]: ranks hold ascending ranges, so the first maximum is the lowest id
    winner = cand[:, :, 0].argmax(dim=0)
    pick = cand.gather(0, winner[None, :, None].expand(1, rows, 3)).squeeze(0)
    return pick[:, 2].round().long(), pick[:, 1] - log_norm


# the ops a tensor-parallel model carries as `model.head_ops` (distributed/parallelize.py apply_tp)
HEAD_OPS = SimpleNamespace(linear_logprob=tp_linear_logprob, sample_next=tp_sample_next)
