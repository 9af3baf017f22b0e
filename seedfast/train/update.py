"""The policy update: mini-batches of step samples → packed forward → fused loss (no logits) → optimizer step.

Aggregation weights are computed over the whole mini-batch before it is cut into micro-batches, so the sum of
the micro-batch losses is exactly the mini-batch loss (the token count is the global one: docs/algorithms.md, 'Total
loss and aggregation') and the result does not depend on the token budget.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch

from seedfast.algo import losses
from seedfast.config import CorrectionConfig, LossConfig
from seedfast.context.sample import StepSample
from seedfast.distributed.data import DataParallel
from seedfast.ops import LossOptions, divergence_kind, fused_divergence, fused_loss
from seedfast.scoring.packing import prompt_order, split_by_budget
from seedfast.scoring.prefix_kv_teacher import teacher_logprob_with_prefix
from seedfast.scoring.shared_prompts import response_rows
from seedfast.train.correction import CorrectionTally, correction_weights
from seedfast.train.teacher_evidence import TeacherEvidence, policy_gradient_weight, shift_gradient_weight


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
    # the rollout correction's stop-gradient weight of the policy term per response token [N] (train/correction.py);
    # folded into the advantages: w·pg(A) = pg(w·A) for w >= 0, and a token of weight 0 is dropped from every term
    # (`kept`; docs/algorithms.md, 'Rollout correction': the masking rule)
    pg_weight: torch.Tensor | None = None
    # [N, d]: the teacher context's final hidden rows from the scoring pass (θ_old), for the full-vocabulary forms of
    # the teacher term (loss.opd_mode reverse_kl / jsd); N × d, never N × V
    teacher_hidden: torch.Tensor | None = None
    # no scoring pass ran (the plan is on-policy): the update's forward, under θ_old, gives the train/rollout
    # diagnostics, whatever ℓold is (a stale batch's behaviour log-probs included)
    diagnose_in_update: bool = False

    def __post_init__(self) -> None:
        if self.teacher_from_forward and (self.teacher_logprob is not None or self.teacher_mask is not None):
            raise ValueError("UpdateBatch: teacher_from_forward computes ℓskill in the update; do not also pass "
                             "teacher_logprob / teacher_mask")
        lengths = torch.tensor([len(s.response_ids) for s in self.samples], dtype=torch.long)
        self.offsets = torch.zeros(len(self.samples) + 1, dtype=torch.long)
        self.offsets[1:] = torch.cumsum(lengths, 0)
        n = int(self.offsets[-1])
        for name in ("old_logprob", "ref_logprob", "teacher_logprob", "teacher_mask", "pg_weight"):
            t = getattr(self, name)
            if t is not None and t.shape != (n,):
                raise ValueError(f"UpdateBatch.{name} must have shape ({n},) (all response tokens), "
                                 f"got {tuple(t.shape)}")
        if self.teacher_hidden is not None and (self.teacher_hidden.dim() != 2 or self.teacher_hidden.shape[0] != n):
            raise ValueError(f"UpdateBatch.teacher_hidden must have shape ({n}, d) (all response tokens), "
                             f"got {tuple(self.teacher_hidden.shape)}")
        if self.advantages.shape == (len(self.samples),):
            self.advantages = torch.repeat_interleave(self.advantages, lengths)
        elif self.advantages.shape != (n,):
            raise ValueError(f"UpdateBatch.advantages must be [{len(self.samples)}] per sample or [{n}] per token, "
                             f"got {tuple(self.advantages.shape)}")
        # the response tokens that enter the loss: all, or those the correction gives a weight above 0
        self.kept: torch.Tensor | None = None
        if self.pg_weight is not None:
            if not bool((self.pg_weight >= 0).all()):
                raise ValueError("UpdateBatch.pg_weight must be >= 0 (an importance weight or a mask)")
            self.advantages = self.advantages * self.pg_weight.detach().to(self.advantages)
            self.kept = self.pg_weight.detach() > 0

    def token_slice(self, i: int) -> slice:
        return slice(int(self.offsets[i]), int(self.offsets[i + 1]))

    def kept_tokens(self, index: list[int]) -> int:
        """How many response tokens of the samples `index` enter the loss (the masking rule)."""
        if self.kept is None:
            return sum(len(self.samples[i].response_ids) for i in index)
        return sum(int(self.kept[self.token_slice(i)].sum()) for i in index)


def _token_weights(batch: UpdateBatch, index: list[int], agg: str, dp: DataParallel | None = None) -> torch.Tensor:
    """Aggregation weights of the mini-batch `index`, flattened to its response tokens (sample order). With `dp`
    the mini-batch is this rank's part of one spread over the data-parallel ranks, and the counts are the global
    ones (docs/scaling.md, 'The loss on N ranks')."""
    lengths = [len(batch.samples[i].response_ids) for i in index]
    mask = torch.zeros(len(index), max(lengths, default=0))
    for r, n in enumerate(lengths):
        mask[r, :n] = 1
    if dp is None:
        weights = losses.aggregation_weights(mask, agg)
    else:
        tokens, seqs = dp.sum([sum(lengths), sum(n > 0 for n in lengths)])
        weights = losses.aggregation_weights(mask, agg, global_tokens=tokens, global_seqs=seqs)
    return torch.cat([weights[r, :n] for r, n in enumerate(lengths)]) if lengths else torch.zeros(0)


def _gather(t: torch.Tensor | None, batch: UpdateBatch, index: list[int]) -> torch.Tensor | None:
    if t is None:
        return None
    return torch.cat([t[batch.token_slice(i)] for i in index])


def loss_options(loss_cfg: LossConfig, *, use_kl: bool, use_opd: bool) -> LossOptions:
    """The loss's knobs from the `loss:` config, the one place they are read: the KL and OPD coefficients are 0 when
    the update has no ℓref (use_kl False) or no ℓskill (use_opd False)."""
    return LossOptions(clip_low=loss_cfg.clip_low, clip_high=loss_cfg.clip_high, dual_clip=loss_cfg.dual_clip,
                       kl_coef=loss_cfg.kl_coef if use_kl else 0.0, kl_kind=loss_cfg.kl_kind,
                       entropy_coef=loss_cfg.entropy_coef, opd_coef=loss_cfg.opd_coef if use_opd else 0.0,
                       opd_beta=loss_cfg.opd_beta, gate=loss_cfg.gate, opd_mode=loss_cfg.opd_mode,
                       opd_adv_clip=loss_cfg.opd_adv_clip, opd_jsd_beta=loss_cfg.opd_jsd_beta)


def minibatch_loss_backward(model, batch: UpdateBatch, index: list[int], loss_cfg: LossConfig, *,
                            use_kl: bool, use_opd: bool, temperature: float, token_budget: int,
                            attn_backend: str | None = None, dp: DataParallel | None = None,
                            evidence: TeacherEvidence | None = None,
                            first_look: bool = False,
                            correction: CorrectionTally | None = None) -> tuple[float, dict[str, float]]:
    """Forward + backward of one mini-batch (gradients accumulate in the parameters); returns (loss, metrics).

    `evidence` (train/teacher_evidence.py) gets the OPD and policy terms' gradient weights of every micro-batch and,
    with `first_look` (the samples' first forward in this update) when the forward scores the teacher itself, the
    winners' and losers' Δ under the same parameters on both sides.

    With `dp` (a model sharded by distributed/parallelize.py), `index` is this rank's part of a mini-batch spread over
    the data-parallel ranks: the weights use the global counts, every rank runs as many micro-batches as the
    busiest one (the extra ones with weight 0: FSDP2's collectives need the same calls on every rank), and the
    returned loss and metrics are the global ones. `correction`: the train/rollout diagnostics this forward adds its
    samples' to (the scored samples' of an update whose first mini-batch scores itself), reported in the metrics."""
    # unsharded, a prompt repeated in a micro-batch runs once: its samples go into the same micro-batches. Sharded,
    # every rank must make the same model calls (FSDP2's collectives), so each sample runs its own prompt
    share_prompts = dp is None and not _is_fsdp(model)
    if share_prompts:
        index = prompt_order(batch.samples, index)
    weights_all = _token_weights(batch, index, loss_cfg.agg, dp) * batch.loss_scale
    if batch.kept is not None:  # the masking rule: out of every term's numerator, still in the denominator
        weights_all = weights_all * _gather(batch.kept, batch, index).to(weights_all)
    pos = {i: k for k, i in enumerate(index)}
    local_offsets = torch.zeros(len(index) + 1, dtype=torch.long)
    local_offsets[1:] = torch.cumsum(torch.tensor([len(batch.samples[i].response_ids) for i in index]), 0)
    costs = [(len(batch.samples[i].prompt_ids) + len(batch.samples[i].response_ids) - 1,) for i in index]
    groups = split_by_budget(costs, token_budget, [batch.samples[i].describe(i) for i in index])
    padding = 0
    if dp is not None:  # a rank without samples (fewer samples than ranks) runs padding micro-batches only
        padding = int(dp.max([len(groups)])[0]) - len(groups)
    teacher_here = use_opd and batch.teacher_from_forward
    divergence = (divergence_kind(loss_cfg.opd_mode, loss_cfg.opd_jsd_beta)
                  if use_opd and loss_cfg.opd_mode in losses.DIVERGENCE_MODES else None)
    if divergence is not None and not teacher_here and batch.teacher_hidden is None:
        raise ValueError(f"loss.opd_mode={loss_cfg.opd_mode!r} needs the teacher's hidden rows: the update batch has "
                         "teacher log-probs from the scoring pass but no teacher_hidden (score(..., "
                         "keep_teacher_hidden=True))")
    run = _MicroBatchRun(loss_options(loss_cfg, use_kl=use_kl, use_opd=use_opd), use_kl=use_kl, use_opd=use_opd,
                         teacher_here=teacher_here, share_prompts=share_prompts, temperature=temperature,
                         attn_backend=attn_backend, evidence=evidence, first_look=first_look, divergence=divergence)
    sums = _MiniBatchSums() if correction is None else _MiniBatchSums(correction=correction)
    for k in range(len(groups) + padding):
        if k < len(groups):
            part, micro = batch, [index[g] for g in groups[k]]
            w = torch.cat([weights_all[int(local_offsets[pos[i]]):int(local_offsets[pos[i] + 1])] for i in micro])
        else:  # the rank's first sample at weight 0 (it contributes nothing, but runs the collectives), or a
            # one-token stand-in on a rank with no sample at all
            part, micro = (batch, [index[0]]) if index else (_STAND_IN, [0])
            w = torch.zeros(len(part.samples[micro[0]].response_ids))
        with _collective_free(model, dp if teacher_here else None):
            _micro_batch(model, part, micro, w, run, sums if k < len(groups) else None)
    if dp is not None:
        sums.reduce(dp)
    return sums.loss, sums.metrics()


@dataclass(frozen=True)
class _MicroBatchRun:
    """How every micro-batch of one mini-batch runs its forward and its loss."""

    options: LossOptions
    use_kl: bool  # ℓref enters the loss
    use_opd: bool  # ℓskill enters the loss
    teacher_here: bool  # ℓskill comes from the update's own forward (its prefix KV)
    share_prompts: bool  # a prompt repeated in a micro-batch runs once (scoring/shared_prompts.py)
    temperature: float
    attn_backend: str | None
    evidence: TeacherEvidence | None = None  # the update's teacher evidence, added to by each micro-batch
    first_look: bool = False  # the samples' first forward in this update (the contrast is measured there)
    divergence: tuple[str, float] | None = None  # (kind, β) of a full-vocabulary teacher term (ops/divergence.py)


_TEACHER_MEANS = ("gate_mean", "opd_term")  # means over teacher-valid tokens (ops/token_loss.py metric_means)


@dataclass
class _MiniBatchSums:
    """What the micro-batches of one mini-batch add up. `metric_sums` holds only the loss's own metric names (weighted
    sums; ratio_min / ratio_max their extremes); the sums the means divide by and the gap diagnostics are fields, so
    no bookkeeping rides in the metrics a caller logs."""

    loss: float = 0.0  # the mini-batch loss: the sum of the micro-batch losses
    weight: float = 0.0  # Σ token weights
    teacher_weight: float = 0.0  # Σ token weights over teacher-valid tokens
    metric_sums: dict[str, float] = field(default_factory=dict)
    # the train/rollout diagnostics of an on-policy update (ℓθ of this forward is ℓθ_old): train/correction.py
    correction: CorrectionTally = field(default_factory=CorrectionTally)

    def add_metrics(self, metrics: dict[str, torch.Tensor], weight: float, teacher_weight: float) -> None:
        """Add one micro-batch's metric means (fused_loss's, weighted by that micro-batch's weights; gate_mean and
        opd_term by its teacher-valid weights): re-weighted to the mini-batch, so they do not depend on the split."""
        sums = self.metric_sums
        for k, v in metrics.items():
            v = float(v)
            if k == "ratio_min":
                sums[k] = min(sums.get(k, math.inf), v)
            elif k == "ratio_max":
                sums[k] = max(sums.get(k, -math.inf), v)
            elif k in _TEACHER_MEANS:
                sums[k] = sums.get(k, 0.0) + v * teacher_weight
            elif k != "loss":  # the mini-batch loss is the sum of the micro-batch losses (self.loss)
                sums[k] = sums.get(k, 0.0) + v * weight
        self.weight += weight
        self.teacher_weight += teacher_weight

    def reduce(self, dp: DataParallel) -> None:
        """The global sums over the data-parallel ranks: min / max where the metric is one, sums otherwise. Ranks
        that lack a metric (no teacher tokens) count as 0 (as +inf / -inf for min / max)."""
        own, sums = self.metric_sums, {}
        keys = dp.union_keys(own)
        mins = [k for k in keys if k == "ratio_min"]
        maxs = [k for k in keys if k == "ratio_max"]
        adds = [k for k in keys if k not in mins and k not in maxs]
        # one all-reduce for every sum, the fields first
        fields = [self.loss, self.weight, self.teacher_weight]
        added = dp.sum([*fields, *(own.get(k, 0.0) for k in adds)])
        self.loss, self.weight, self.teacher_weight = added[:len(fields)]
        sums.update(zip(adds, added[len(fields):]))
        sums.update(zip(mins, dp.min([own.get(k, math.inf) for k in mins])))
        sums.update(zip(maxs, dp.max([own.get(k, -math.inf) for k in maxs])))
        self.metric_sums = sums
        self.correction.reduce(dp)

    def metrics(self) -> dict[str, float]:
        """The mini-batch's metrics: weighted means, the loss, and the gap diagnostics where there were tokens."""
        out = {k: (v if k.startswith("ratio_") else
                   v / max(self.teacher_weight if k in _TEACHER_MEANS else self.weight, 1e-12))
               for k, v in self.metric_sums.items()}
        return {**out, "loss": self.loss, **self.correction.metrics()}


def _head_loss(model: torch.nn.Module):
    """fused_loss, or its tensor-parallel twin on a model whose LM head dist's apply_tp split over the vocabulary
    (it sets `model.head_ops`). Any other sharded head here is a bug: FSDP2 left it sharded after the forward."""
    if getattr(model, "head_ops", None) is not None:
        from seedfast.distributed.vocab_head import tp_fused_loss

        return tp_fused_loss
    if type(model.lm_head_weight).__name__ == "DTensor":
        raise RuntimeError("the LM head reached the loss still sharded over the data-parallel ranks (an FSDP2 root "
                           "resharded after forward); the root must keep its parameters gathered until backward")
    return fused_loss


def _head_divergence(model: torch.nn.Module):
    """fused_divergence, or its tensor-parallel twin on a vocabulary-parallel LM head (as _head_loss)."""
    if getattr(model, "head_ops", None) is not None:
        from seedfast.distributed.vocab_head import tp_fused_divergence

        return tp_fused_divergence
    return fused_divergence


def _collective_free(model, dp: DataParallel | None):
    """With `dp`, the model's FSDP2 units stay gathered through the micro-batch, so that the teacher branch (run
    only on ranks whose micro-batch has a teacher) issues no collectives."""
    if dp is None:
        return contextlib.nullcontext()
    from seedfast.distributed.parallelize import unsharded

    return unsharded(model)


def _micro_batch(model, batch: UpdateBatch, micro: list[int], w: torch.Tensor, run: _MicroBatchRun,
                 sums: _MiniBatchSums | None) -> None:
    """Forward + backward of the samples `micro` of `batch` with token weights `w`; adds the loss and its metrics to
    `sums`. sums None: a padding micro-batch (weight 0) of a data-parallel rank with fewer micro-batches than the
    busiest, run for its collectives only."""
    device = model.lm_head_weight.device
    micro_samples = [batch.samples[i] for i in micro]
    rows, targets, kv = response_rows(model, micro_samples, share_prompts=run.share_prompts,
                                      return_kv=run.teacher_here, attn_backend=run.attn_backend)
    # on-policy (old_logprob None: one epoch, one mini-batch): θ_old = θ, so ℓold is the detached ℓθ that
    # fused_loss computes anyway; no separate ℓold pass, not even over the LM head
    old = None if batch.old_logprob is None else _gather(batch.old_logprob, batch, micro).to(device)
    teacher_hidden = None
    if run.teacher_here:
        teacher = teacher_logprob_with_prefix(model, kv, micro_samples, temperature=run.temperature,
                                              attn_backend=run.attn_backend, return_hidden=run.divergence is not None)
        teacher_logprob, teacher_mask = teacher[:2]
        teacher_hidden = teacher[2] if run.divergence is not None else None
        del kv, teacher
    elif run.use_opd:
        teacher_logprob = _gather(batch.teacher_logprob, batch, micro).to(device)
        teacher_mask = _gather(batch.teacher_mask, batch, micro).to(device)
        if run.divergence is not None:
            teacher_hidden = _gather(batch.teacher_hidden, batch, micro).to(device)
    else:
        teacher_logprob = teacher_mask = None
    loss, metrics, logprob = _head_loss(model)(
        rows, model.lm_head_weight, targets,
        token_weights=w.to(device),
        advantages=_gather(batch.advantages, batch, micro).to(device),
        old_logprob=old,
        ref_logprob=_gather(batch.ref_logprob, batch, micro).to(device) if run.use_kl else None,
        teacher_logprob=teacher_logprob, teacher_mask=teacher_mask,
        options=run.options, temperature=run.temperature, return_logprob=True,
    )
    if run.divergence is not None:
        loss = loss + run.options.opd_coef * _divergence_term(model, rows, teacher_hidden, w.to(device) * teacher_mask,
                                                              run, metrics)
    loss.backward()
    if sums is None:
        return
    if old is None or batch.diagnose_in_update:  # no scoring pass: this forward's ℓθ is θ_old's (step_plan.py)
        correction_weights(logprob, micro_samples, _NO_CORRECTION, sums.correction)
    twsum = float((w.to(device) * teacher_mask.float()).sum()) if teacher_logprob is not None else 0.0
    if run.evidence is not None and teacher_logprob is not None:
        if run.teacher_here and run.first_look:
            run.evidence.add_contrast(logprob, teacher_logprob, teacher_mask, micro_samples)
        advantages = _gather(batch.advantages, batch, micro).to(device)
        pg = policy_gradient_weight(logprob, old, advantages, w.to(device), run.options)
        if run.options.opd_mode == "gate":
            # ∂(λ·opd)/∂ℓθ = −λ·w·m·g (the gate is detached), so its weight is λ·Σ w·m·g = λ·gate_mean·Σ w·m
            run.evidence.add_gradient_weights(run.options.opd_coef * float(metrics["gate_mean"]) * twsum, pg)
        elif run.options.opd_mode == "advantage":
            shift = losses.opd_advantage_shift(teacher_logprob, logprob if old is None else old, teacher_mask,
                                               run.options.opd_coef, run.options.opd_adv_clip)
            run.evidence.add_gradient_weights(
                shift_gradient_weight(logprob, old, advantages, shift, w.to(device), run.options), pg)
        # the divergence forms push the logits of the whole vocabulary, not ℓθ: no share of ℓθ's gradient to log
    sums.loss += float(loss.detach())
    sums.add_metrics(metrics, float(w.sum()), twsum)


def _divergence_term(model, rows: torch.Tensor, teacher_hidden: torch.Tensor | None, coef: torch.Tensor,
                     run: _MicroBatchRun, metrics: dict[str, torch.Tensor]) -> torch.Tensor:
    """Σ_t w_t·m_t·D_t (before λ) of the full-vocabulary teacher term; its teacher-valid mean goes into `metrics` as
    opd_term."""
    kind, beta = run.divergence
    if teacher_hidden is None:  # the padding stand-in of a data-parallel rank without samples: weight 0
        teacher_hidden = torch.zeros_like(rows)
    term, value = _head_divergence(model)(rows, teacher_hidden.to(rows.dtype), model.lm_head_weight,
                                          token_weights=coef, kind=kind, beta=beta, temperature=run.temperature)
    total = coef.sum()
    metrics["opd_term"] = torch.where(total > 0, (coef * value).sum() / total.clamp_min(1e-30), 0.0)
    return term


def _is_fsdp(model) -> bool:
    from seedfast.distributed.parallelize import fsdp_modules

    return bool(fsdp_modules(model))


_NO_CORRECTION = CorrectionConfig()  # mode none: the diagnostics only

# the padding micro-batch of a data-parallel rank that has no sample of its own (weight 0, no teacher)
_STAND_IN = UpdateBatch([StepSample(prompt_ids=[0], response_ids=[0], teacher_valid=False)], torch.zeros(1),
                        None, ref_logprob=torch.zeros(1), teacher_logprob=torch.zeros(1),
                        teacher_mask=torch.zeros(1, dtype=torch.bool))
