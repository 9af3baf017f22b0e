"""What one RL step computes, decided once from the config (docs/algorithms.md, docs/architecture.md).

The trainer's loop reads this plan instead of re-deriving the same facts from the algorithm's spec
(train/algorithms.py), `opd_coef`, `teacher_params`, `ppo_epochs` and `mini_batches` at each branch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from seedfast.config import Config
from seedfast.train.algorithms import AlgorithmSpec, algorithm_spec

TeacherSource = Literal["none", "scorer", "update"]


@dataclass(frozen=True)
class StepPlan:
    privileged_text: bool  # write skills / guidance for the rollout's trajectories
    teacher: TeacherSource  # where the teacher's log-probs come from: nowhere, the scoring pass, the update's forward
    score_pass: bool  # a separate no-grad pass for ℓold (and the teacher) before the update
    kl: bool  # a reference policy and the KL term
    opd: bool  # the on-policy distillation term (when some sample has a teacher context)
    reflection_update: bool  # GRSD: the RL loss on the reflections themselves
    on_policy: bool  # one epoch, one mini-batch: θ = θ_old during the update
    algorithm: AlgorithmSpec  # the rest of what the algorithm does: its judge, its advantage modulation
    # the scoring pass leaves out the first mini-batch's samples: its update forward runs under θ_old, so it gives
    # their ℓold (the detached ℓθ) and their teacher (from its prefix KV) itself (docs/performance.md, 'The first
    # mini-batch scores itself')
    first_minibatch_scores_itself: bool = False


def plan_step(cfg: Config) -> StepPlan:
    """The plan of every step of a run with this config."""
    spec = algorithm_spec(cfg.algorithm)
    on_policy = cfg.trainer.ppo_epochs == 1 and cfg.trainer.mini_batches == 1
    opd = spec.opd and cfg.loss.opd_coef > 0
    if opd:
        # on-policy the update's own forward gives ℓskill from its prefix KV (θ = θ_old); with the current
        # parameters it must be the update's forward anyway; otherwise θ_old's scoring pass gives it
        teacher: TeacherSource = "update" if on_policy or cfg.skill.teacher_params == "current" else "scorer"
    elif spec.teacher == "scorer":
        teacher = "scorer"  # GRSD's turn-level δ is measured before the update
    else:
        teacher = "none"
    # fully on-policy, ℓold is the detached ℓθ of the update's own forward: no separate pass is needed unless the
    # samples may carry a teacher context (privileged text) whose log-probs the update's forward does not give, or
    # the rollout correction weights the policy term: its weight needs ℓold before the loss (docs/algorithms.md,
    # 'Rollout correction')
    score_pass = (not (on_policy and (spec.privileged is None or teacher == "update"))
                  or cfg.rollout.correction.mode != "none")
    # one epoch of several mini-batches, one process, synchronous, no correction weight (it needs every ℓold before
    # the loss) and no advantage that reads the scoring pass (GRSD): the first mini-batch needs no scoring pass
    first_scores_itself = (score_pass and cfg.trainer.ppo_epochs == 1 and cfg.trainer.mini_batches > 1
                           and cfg.rollout.correction.mode == "none" and spec.modulate is None
                           and cfg.rollout.max_staleness == 0 and cfg.dist.strategy == "none")
    return StepPlan(privileged_text=spec.privileged is not None, teacher=teacher, score_pass=score_pass,
                    kl=cfg.loss.kl_coef > 0, opd=opd, reflection_update=spec.reflection_update, on_policy=on_policy,
                    algorithm=spec, first_minibatch_scores_itself=first_scores_itself)
