"""GRSD stage A, the reflection update: PPO-clip on the policy's own reflection tokens with judge-normalized
advantages, weight α = grsd.reflection_coef (docs/algorithms.md, 'GRSD').

One process or N: the judge scores are normalized within each group on the rank that rolled the group out (a
group never straddles ranks), the reflections are then spread over the data-parallel ranks by token count, and the
loss is the token-mean over every rank's reflections (train/update.py), so N ranks take the one-process step.
"""

from __future__ import annotations

import math

import torch

from seedfast.algo import grsd as grsd_math
from seedfast.config import Config
from seedfast.context.sample import StepSample
from seedfast.distributed.data import DataParallel, balance_samples
from seedfast.distributed.parallelize import unsharded
from seedfast.runtime.optim import grad_norm_and_clip
from seedfast.scoring import score
from seedfast.train.privileged import Reflections
from seedfast.train.update import UpdateBatch, minibatch_loss_backward


def reflection_update(cfg: Config, policy: torch.nn.Module, optimizer: torch.optim.Optimizer,
                      reflections: Reflections, group_of: list, dp: DataParallel | None = None) -> dict[str, float]:
    """One optimizer step on this step's reflections (this rank's, with `dp`); returns its metrics."""
    keep = [i for i, ids in enumerate(reflections.response_ids) if ids]
    n_kept = len(keep) if dp is None else int(dp.sum([len(keep)])[0])
    if not n_kept:
        return {}
    # every reflection counts in its group's normalization, one with no token too (scored 0: docs/algorithms.md,
    # 'GRSD'); only those with tokens take the loss
    scores = torch.tensor(reflections.scores, dtype=torch.float32)
    adv = grsd_math.reflection_advantages(scores, list(group_of))[torch.tensor(keep, dtype=torch.long)]
    signal = bool((adv != 0).any()) if dp is None else dp.max([float((adv != 0).any())])[0] > 0
    if not signal:
        return {"grsd/reflection_loss": 0.0}
    samples = [StepSample(prompt_ids=reflections.prompt_ids[i], response_ids=reflections.response_ids[i],
                          sample_id=("refl", i)) for i in keep]
    if dp is not None:
        samples, adv, _ = balance_samples(dp, samples, adv, {})
    with unsharded(policy):  # ranks score different numbers of micro-batches: no collectives inside
        old = score(policy, samples, token_budget=cfg.trainer.micro_batch_tokens,
                    temperature=cfg.rollout.temperature).logprob if samples else None
    batch = UpdateBatch(samples, adv, old, loss_scale=cfg.grsd.reflection_coef)
    loss_cfg = cfg.loss.__class__(**{**cfg.loss.__dict__, "kl_coef": 0.0, "entropy_coef": 0.0, "opd_coef": 0.0})
    optimizer.zero_grad(set_to_none=True)
    loss, _ = minibatch_loss_backward(policy, batch, list(range(len(samples))), loss_cfg, use_kl=False,
                                      use_opd=False, temperature=cfg.rollout.temperature,
                                      token_budget=cfg.trainer.micro_batch_tokens, dp=dp)
    norm = grad_norm_and_clip(optimizer, cfg.optim.grad_clip)
    if math.isfinite(loss) and math.isfinite(norm):  # the global loss and norm: every rank decides alike
        optimizer.step()
    return {"grsd/reflection_loss": loss}
