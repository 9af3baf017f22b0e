"""The policy update: mini-batches of step samples → packed forward → fused loss (no logits) → optimizer step.

Aggregation weights are computed over the whole mini-batch before it is cut into micro-batches, so the sum of
the micro-batch losses is exactly the mini-batch loss (the token count is the global one: docs/algorithms.md, 'Total
loss and aggregation') and the result does not depend on the token budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from seedfast.algo import losses
from seedfast.config import LossConfig
from seedfast.context.sample import StepSample
from seedfast.ops import fused_loss
from seedfast.scoring.packing import pack_single, split_by_budget
from seedfast.scoring.prefix_kv_teacher import teacher_logprob_with_prefix


@dataclass
class UpdateBatch:
    """Everything the loss needs, per sample (response tokens packed in sample order, like `Scores`)."""

    samples: list[StepSample]
    advantages: torch.Tensor  # [S] per sample, or [N] per response token
    old_logprob: torch.Tensor | None  # [N]; None = on-policy: ℓold is the detached ℓθ of the update forward
    ref_logprob: torch.Tensor | None = None  # [N]
    teacher_logprob: torch.Tensor | None = None  # [N], 0 where teacher_mask is False
    teacher_mask: torch.Tensor | None = None  # [N] bool
    loss_scale: float = 1.0  # e.g. GRSD's α for reflection samples
    # ℓskill from the update's own forward, its teacher branches reusing that forward's prefix KV, so the
    # history is never run a second time (docs/performance.md, 'The teacher reuses the prefix KV'): exact for
    # teacher_params "old" when the update is on-policy (θ = θ_old there), and the definition of teacher_params
    # "current" otherwise.
    teacher_from_forward: bool = False

    def __post_init__(self) -> None:
        if self.teacher_from_forward and (self.teacher_logprob is not None or self.teacher_mask is not None):
            raise ValueError("UpdateBatch: teacher_from_forward computes ℓskill in the update; do not also pass "
                             "teacher_logprob / teacher_mask")
        lengths = torch.tensor([len(s.response_ids) for s in self.samples], dtype=torch.long)
        self.offsets = torch.zeros(len(self.samples) + 1, dtype=torch.long)
        self.offsets[1:] = torch.cumsum(lengths, 0)
        n = int(self.offsets[-1])
        for name in ("old_logprob", "ref_logprob", "teacher_logprob", "teacher_mask"):
            t = getattr(self, name)
            if t is not None and t.shape != (n,):
                raise ValueError(f"UpdateBatch.{name} must have shape ({n},) (all response tokens), "
                                 f"got {tuple(t.shape)}")
        if self.advantages.shape == (len(self.samples),):
            self.advantages = torch.repeat_interleave(self.advantages, lengths)
        elif self.advantages.shape != (n,):
            raise ValueError(f"UpdateBatch.advantages must be [{len(self.samples)}] per sample or [{n}] per token, "
                             f"got {tuple(self.advantages.shape)}")

    def token_slice(self, i: int) -> slice:
        return slice(int(self.offsets[i]), int(self.offsets[i + 1]))


def _token_weights(batch: UpdateBatch, index: list[int], agg: str) -> torch.Tensor:
    """Aggregation weights of the mini-batch `index`, flattened to its response tokens (sample order)."""
    lengths = [len(batch.samples[i].response_ids) for i in index]
    mask = torch.zeros(len(index), max(lengths, default=0))
    for r, n in enumerate(lengths):
        mask[r, :n] = 1
    weights = losses.aggregation_weights(mask, agg)
    return torch.cat([weights[r, :n] for r, n in enumerate(lengths)]) if lengths else torch.zeros(0)


def _gather(t: torch.Tensor | None, batch: UpdateBatch, index: list[int]) -> torch.Tensor | None:
    if t is None:
        return None
    return torch.cat([t[batch.token_slice(i)] for i in index])


def minibatch_loss_backward(model, batch: UpdateBatch, index: list[int], loss_cfg: LossConfig, *,
                            use_kl: bool, use_opd: bool, temperature: float, token_budget: int,
                            attn_backend: str | None = None) -> tuple[float, dict[str, float]]:
    """Forward + backward of one mini-batch (gradients accumulate in the parameters); returns (loss, metrics)."""
    weights_all = _token_weights(batch, index, loss_cfg.agg) * batch.loss_scale
    pos = {i: k for k, i in enumerate(index)}
    local_offsets = torch.zeros(len(index) + 1, dtype=torch.long)
    local_offsets[1:] = torch.cumsum(torch.tensor([len(batch.samples[i].response_ids) for i in index]), 0)
    costs = [(len(batch.samples[i].prompt_ids) + len(batch.samples[i].response_ids) - 1,) for i in index]
    groups = split_by_budget(costs, token_budget, [batch.samples[i].describe(i) for i in index])
    device = model.lm_head_weight.device
    total_loss, sums, weight_sum = 0.0, {}, 0.0
    teacher_here = use_opd and batch.teacher_from_forward
    for group in groups:
        micro = [index[g] for g in group]
        micro_samples = [batch.samples[i] for i in micro]
        packed = pack_single(micro_samples).to(device)
        out = model(packed.input_ids, packed.cu_seqlens, position_ids=packed.position_ids,
                    return_kv=teacher_here, attn_backend=attn_backend)
        hidden, kv = out if teacher_here else (out, None)
        w = torch.cat([weights_all[int(local_offsets[pos[i]]):int(local_offsets[pos[i] + 1])] for i in micro])
        rows = hidden[packed.rows]
        # on-policy (old_logprob None: one epoch, one mini-batch): θ_old = θ, so ℓold is the detached ℓθ that
        # fused_loss computes anyway; no separate ℓold pass, not even over the LM head
        old = None if batch.old_logprob is None else _gather(batch.old_logprob, batch, micro).to(device)
        if teacher_here:
            teacher_logprob, teacher_mask = teacher_logprob_with_prefix(
                model, kv, micro_samples, temperature=temperature, attn_backend=attn_backend)
            del kv
        elif use_opd:
            teacher_logprob = _gather(batch.teacher_logprob, batch, micro).to(device)
            teacher_mask = _gather(batch.teacher_mask, batch, micro).to(device)
        else:
            teacher_logprob = teacher_mask = None
        loss, metrics, logprob = fused_loss(
            rows, model.lm_head_weight, packed.targets,
            token_weights=w.to(device),
            advantages=_gather(batch.advantages, batch, micro).to(device),
            old_logprob=old,
            ref_logprob=_gather(batch.ref_logprob, batch, micro).to(device) if use_kl else None,
            teacher_logprob=teacher_logprob, teacher_mask=teacher_mask,
            clip_low=loss_cfg.clip_low, clip_high=loss_cfg.clip_high, dual_clip=loss_cfg.dual_clip,
            kl_coef=loss_cfg.kl_coef if use_kl else 0.0, kl_kind=loss_cfg.kl_kind,
            entropy_coef=loss_cfg.entropy_coef, opd_coef=loss_cfg.opd_coef if use_opd else 0.0,
            opd_beta=loss_cfg.opd_beta, gate=loss_cfg.gate, temperature=temperature, return_logprob=True,
        )
        loss.backward()
        if old is None:
            accumulate_rollout_gap(sums, logprob, micro_samples)
        if teacher_logprob is not None:
            accumulate_teacher_gap(sums, logprob, teacher_logprob, teacher_mask, micro_samples)
        total_loss += float(loss.detach())
        # metrics are means weighted by this micro-batch's weights: re-weight to the mini-batch
        wsum = float(w.sum())
        weight_sum += wsum
        for k, v in metrics.items():
            v = float(v)
            if k == "ratio_min":
                sums[k] = min(sums.get(k, math.inf), v)
            elif k == "ratio_max":
                sums[k] = max(sums.get(k, -math.inf), v)
            else:
                sums[k] = sums.get(k, 0.0) + v * wsum
    gap = {**rollout_gap_metrics(sums), **teacher_gap_metrics(sums)}
    out = {k: (v if k.startswith("ratio_") else v / max(weight_sum, 1e-12)) for k, v in sums.items()}
    return total_loss, {**out, **gap}


def rollout_gap_metrics(sums: dict[str, float]) -> dict[str, float]:
    """Pop the sums of `accumulate_rollout_gap` out of `sums` and turn them into metrics."""
    gap = {k: sums.pop(k) for k in ("_gap_sum", "_gap_n", "_gap_max") if k in sums}
    if not gap.get("_gap_n"):
        return {}
    return {"rollout/logprob_gap_mean": gap["_gap_sum"] / gap["_gap_n"], "rollout/logprob_gap_max": gap["_gap_max"]}


def accumulate_rollout_gap(sums: dict[str, float], logprob: torch.Tensor, samples: list[StepSample]) -> None:
    """Train-vs-rollout log-prob gap: a silent weight-sync failure shows here first (docs/pitfalls.md, 'Weight sync
    that silently does nothing')."""
    rollout = [s.meta.get("rollout_logprobs") for s in samples]
    if any(r is None for r in rollout):
        return
    gap = (logprob.float().cpu() - torch.cat(rollout)).abs()
    sums["_gap_sum"] = sums.get("_gap_sum", 0.0) + float(gap.sum())
    sums["_gap_n"] = sums.get("_gap_n", 0.0) + gap.numel()
    sums["_gap_max"] = max(sums.get("_gap_max", 0.0), float(gap.max()) if gap.numel() else 0.0)


def accumulate_teacher_gap(sums: dict[str, float], logprob: torch.Tensor, teacher_logprob: torch.Tensor,
                           teacher_mask: torch.Tensor, samples: list[StepSample]) -> None:
    """Sums of ℓskill − ℓθ over the teacher-valid response tokens of winning and of losing trajectories: a
    skill that carries signal raises the winners' actions more than the losers'."""
    delta = teacher_logprob.float() - logprob.detach().float()
    valid = teacher_mask.bool()
    lengths = torch.tensor([len(s.response_ids) for s in samples])
    outcome_won = torch.tensor([s.reward + s.penalty > 0 for s in samples])
    won = torch.repeat_interleave(outcome_won, lengths).to(delta.device)
    for name, rows in (("win", valid & won), ("lose", valid & ~won)):
        # reduced on the device: only the scalar sums cross to the host, never the per-token tensors
        sums[f"_tgap_{name}_sum"] = sums.get(f"_tgap_{name}_sum", 0.0) + float(torch.where(rows, delta, 0.0).sum())
        sums[f"_tgap_{name}_n"] = sums.get(f"_tgap_{name}_n", 0.0) + int(rows.sum())


def teacher_gap_metrics(sums: dict[str, float]) -> dict[str, float]:
    """Pop the sums of `accumulate_teacher_gap` out of `sums`: mean ℓskill − ℓθ on winners' and losers' tokens."""
    out = {}
    for name in ("win", "lose"):
        total, n = sums.pop(f"_tgap_{name}_sum", 0.0), sums.pop(f"_tgap_{name}_n", 0.0)
        if n:
            out[f"skill/teacher_gap_{name}"] = total / n
    return out


def grad_norm_and_clip(model: torch.nn.Module, max_norm: float | None) -> float:
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm is not None else math.inf)
    return float(norm)
