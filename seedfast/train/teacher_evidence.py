"""Evidence that the teacher carries signal, in every SEED/SDAR run's metrics (docs/algorithms.md, 'Evidence that
the teacher works').

A mean gap is no evidence: sampled from π, E[ℓskill − ℓθ] = −KL(π‖π_skill) ≤ 0 whatever the skill says, so a
negative mean Δ and a gap gate below ½ on average are automatic. What a skill that carries signal changes is the
contrast: it raises the winners' actions more than the losers'. And a teacher whose weight in the update is
negligible does nothing however right it is, so the share of the update's ℓθ-gradient that comes from the OPD term
is logged beside it.

- teacher/delta_win, teacher/delta_lose: mean Δ = ℓskill − ℓθ over the teacher-valid tokens of winning and losing
  trajectories, both sides under the same parameters, the first time each sample is scored (θ_old in the scoring
  pass; when the update's forward scores the teacher, the sample's forward in the first epoch);
- teacher/contrast: delta_win − delta_lose;
- teacher/raised_win, teacher/raised_lose: the share of those tokens the skill raises (Δ > 0: where the gap gate
  σ(β·Δ) opens past ½);
- teacher/opd_share: Σ|∂(λ·opd)/∂ℓθ| / (Σ|∂(λ·opd)/∂ℓθ| + Σ|∂pg/∂ℓθ|) over every optimizer step's tokens, each
  weighted by its aggregation weight: 0 when the teacher moves nothing, 1 when it alone moves the policy. With
  loss.opd_mode `advantage` the teacher's part is Σ|w·(∂pg(A + s)/∂ℓθ − ∂pg(A)/∂ℓθ)| for its shift s; the
  full-vocabulary forms (reverse_kl, jsd) push every logit, not ℓθ, so no share is logged for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass, fields

import torch

from seedfast.algo import losses
from seedfast.algo.losses import LossOptions
from seedfast.context.sample import StepSample
from seedfast.distributed.data import DataParallel


def outcome_won(samples: Sequence[StepSample]) -> torch.Tensor:
    """[S] bool: whether each sample's trajectory won (its outcome, the reward before the step's penalty)."""
    return torch.tensor([s.reward + s.penalty > 0 for s in samples], dtype=torch.bool)


def policy_gradient_weight(logprob: torch.Tensor, old_logprob: torch.Tensor | None, advantages: torch.Tensor,
                           token_weights: torch.Tensor, options: LossOptions) -> float:
    """Σ_t |w_t · ∂pg_t/∂ℓθ_t|: how hard the clipped policy term pushes ℓθ (0 on clipped tokens and where A = 0).
    `old_logprob` None: on-policy, every ratio 1."""
    w = token_weights.detach().float()
    active = w != 0
    lp = torch.where(active, logprob.detach().float(), 0.0).requires_grad_()
    old = lp.detach() if old_logprob is None else torch.where(active, old_logprob.detach().float(), 0.0)
    adv = torch.where(active, advantages.detach().float(), 0.0)
    with torch.enable_grad():
        terms = losses.policy_terms(lp, old, adv, options.clip_low, options.clip_high, options.dual_clip)
        (grad,) = torch.autograd.grad(terms.pg.sum(), lp)
    return float((w.abs() * grad.abs()).sum())


def shift_gradient_weight(logprob: torch.Tensor, old_logprob: torch.Tensor | None, advantages: torch.Tensor,
                          shift: torch.Tensor, token_weights: torch.Tensor, options: LossOptions) -> float:
    """Σ_t |w_t·(∂pg_t(A + s)/∂ℓθ_t − ∂pg_t(A)/∂ℓθ_t)|: how hard the `advantage` form's teacher shift s moves ℓθ
    beyond what the outcome advantage A alone does."""
    w = token_weights.detach().float()
    active = w != 0
    lp = torch.where(active, logprob.detach().float(), 0.0).requires_grad_()
    old = lp.detach() if old_logprob is None else torch.where(active, old_logprob.detach().float(), 0.0)
    adv = torch.where(active, advantages.detach().float(), 0.0)
    grads = []
    for a in (adv + torch.where(active, shift.detach().float(), 0.0), adv):
        with torch.enable_grad():
            terms = losses.policy_terms(lp, old, a, options.clip_low, options.clip_high, options.dual_clip)
            grads.append(torch.autograd.grad(terms.pg.sum(), lp)[0])
    return float((w.abs() * (grads[0] - grads[1]).abs()).sum())


@dataclass
class TeacherEvidence:
    """Sums over one update; `metrics()` turns them into the teacher/* metrics of the module docstring."""

    win_delta: float = 0.0
    win_tokens: float = 0.0
    win_raised: float = 0.0
    lose_delta: float = 0.0
    lose_tokens: float = 0.0
    lose_raised: float = 0.0
    opd_gradient: float = 0.0
    pg_gradient: float = 0.0

    def add_contrast(self, logprob: torch.Tensor, teacher_logprob: torch.Tensor, teacher_mask: torch.Tensor,
                     samples: Sequence[StepSample]) -> None:
        """Add the teacher-valid tokens of `samples` (ℓθ and ℓskill under the same parameters, packed in sample
        order) to the winners' or the losers' sums."""
        delta = teacher_logprob.detach().float() - logprob.detach().float()
        lengths = torch.tensor([len(s.response_ids) for s in samples], dtype=torch.long)
        won = torch.repeat_interleave(outcome_won(samples), lengths).to(delta.device)
        valid = teacher_mask.bool()
        win, lose = valid & won, valid & ~won
        raised = delta > 0
        # reduced on the device: only scalars cross to the host
        self.win_delta += float(torch.where(win, delta, 0.0).sum())
        self.win_tokens += int(win.sum())
        self.win_raised += int((win & raised).sum())
        self.lose_delta += float(torch.where(lose, delta, 0.0).sum())
        self.lose_tokens += int(lose.sum())
        self.lose_raised += int((lose & raised).sum())

    def add_gradient_weights(self, opd: float, pg: float) -> None:
        """Add one micro-batch's Σ|∂(λ·opd)/∂ℓθ| (= λ·Σ w·m·g: the gate is detached) and Σ|∂pg/∂ℓθ|."""
        self.opd_gradient += opd
        self.pg_gradient += pg

    def reduce(self, dp: DataParallel) -> None:
        """The sums over every data-parallel rank (one all-reduce)."""
        for f, value in zip(fields(self), dp.sum(list(astuple(self)))):
            setattr(self, f.name, float(value))

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for side in ("win", "lose"):
            n = getattr(self, f"{side}_tokens")
            if n:
                out[f"teacher/delta_{side}"] = getattr(self, f"{side}_delta") / n
                out[f"teacher/raised_{side}"] = getattr(self, f"{side}_raised") / n
        if self.win_tokens and self.lose_tokens:
            out["teacher/contrast"] = out["teacher/delta_win"] - out["teacher/delta_lose"]
        total = self.opd_gradient + self.pg_gradient
        if total > 0:
            out["teacher/opd_share"] = self.opd_gradient / total
        return out
