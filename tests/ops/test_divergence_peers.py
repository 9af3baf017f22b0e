"""The teacher-term forms against their peers' own code, on the same tensors.

- `fused_divergence` against TRL's GKD loss, the real package: `trl.experimental.gkd.GKDTrainer.generalized_jsd_loss`
  (trl 1.16.0, requirements/lock-cpu.txt) on logits materialized here only for TRL (h·Wᵀ, ht·Wᵀ), its default
  reduction "batchmean" (the sum over the tokens whose label is not -100, divided by their count): our token weights
  are 1/num_valid on those tokens and 0 elsewhere. β = 0 (TRL's forward KL), 0.5, 0.9, 1 (TRL's reverse KL),
  temperature 1 and 2, loss and gradients w.r.t. the student's hidden rows and W, on both of the torch backend's paths.
- `opd_advantage_shift` (opd_mode "advantage") against tinker-cookbook's on-policy distillation advantage,
  **transcribed**: tinker-cookbook does not install beside the lock (0.6.1 needs tml-renderers>=0.4.1, which the
  package index does not have; 0.5.8 pins transformers<=5.5.4 against the lock's 5.24.0), so `_tinker_cookbook_kl_
  advantage` below writes out `incorporate_kl_penalty` of thinking-machines-lab/tinker-cookbook
  tinker_cookbook/distillation/train_on_policy.py (commit 53aaf8de3a681fd7930defcebda262918ff62edd, lines 48-104:
  reverse_kl at lines 85-90, kl_advantages at line 97, the advantages' update at lines 102-104).
"""

import os

import pytest
import torch

from seedfast.algo.losses import opd_advantage_shift
from seedfast.ops import chunked_divergence as cd
from seedfast.ops import divergence_kind, fused_divergence

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
gkd = pytest.importorskip("trl.experimental.gkd", reason="trl (requirements/lock-cpu.txt, the dev extra)")

B, T, D, V = 3, 7, 16, 211  # V: prime, no tile divides it


@pytest.fixture(params=["whole-rows", "tiles"])
def path(request, monkeypatch):
    """The torch backend's two paths: blocks of whole vocabulary rows, or streamed tiles where they do not fit."""
    if request.param == "whole-rows":
        monkeypatch.setenv(cd.DIVERGENCE_BYTES_ENV, str(cd.LIVE_TILES * 4 * V * 8))  # blocks of 8 rows
        monkeypatch.setattr(cd, "MIN_BLOCK_ROWS", 4)
    else:
        monkeypatch.setenv(cd.DIVERGENCE_BYTES_ENV, "64")
        monkeypatch.setenv("SEEDFAST_OPS_TILE_BYTES", "2048")
    return request.param


def problem(seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = 1.5 * torch.randn(B * T, D, generator=gen)
    teacher = hidden + 0.8 * torch.randn(B * T, D, generator=gen)
    weight = torch.randn(V, D, generator=gen)
    labels = torch.randint(0, V, (B, T), generator=gen)
    labels[0, :2] = -100  # a prompt
    labels[2, 5:] = -100  # padding
    labels[1, 3] = -100
    return hidden, teacher, weight, labels


def trl_loss(hidden, teacher, weight, labels, beta, temperature):
    """TRL's loss and its gradients w.r.t. hidden and W, on logits materialized in fp64 (the reference)."""
    h = hidden.double().requires_grad_()
    w = weight.double().requires_grad_()
    student_logits = (h @ w.t()).view(B, T, V)
    teacher_logits = (teacher.double() @ w.detach().t()).view(B, T, V)
    loss = gkd.GKDTrainer.generalized_jsd_loss(student_logits, teacher_logits, labels=labels, beta=beta,
                                               temperature=temperature)
    loss.backward()
    return loss.detach(), h.grad, w.grad


@pytest.mark.parametrize("temperature", [1.0, 2.0])
@pytest.mark.parametrize("beta", [0.0, 0.5, 0.9, 1.0])
def test_fused_divergence_equals_trl_gkd_loss(beta, temperature, path):
    hidden, teacher, weight, labels = problem()
    valid = (labels != -100).reshape(-1)
    token_weights = valid.float() / valid.sum()
    hidden[~valid] = float("nan")  # rows of weight 0 are never read
    want_loss, want_dh, want_dw = trl_loss(hidden.nan_to_num(0.0), teacher, weight, labels, beta, temperature)

    kind, kind_beta = divergence_kind("jsd", beta)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss, value = fused_divergence(h, teacher, w, token_weights=token_weights, kind=kind, beta=kind_beta,
                                   temperature=temperature, backend="torch")
    loss.backward()

    torch.testing.assert_close(loss.double(), want_loss, rtol=2e-5, atol=1e-7)
    assert torch.all(value[~valid] == 0)
    torch.testing.assert_close(h.grad[valid].double(), want_dh[valid], rtol=1e-4, atol=1e-6)
    assert torch.all(h.grad[~valid] == 0)
    torch.testing.assert_close(w.grad.double(), want_dw, rtol=1e-4, atol=1e-6)


def test_trl_jsd_ends_are_the_kls_divergence_kind_names():
    """TRL special-cases β = 0 and β = 1 (its mixture formula would give 0 there); divergence_kind maps them to our
    forward and reverse KL: TRL's own JSD_β, divided by β near 0 and by 1 − β near 1, tends to its loss at the end."""
    hidden, teacher, weight, labels = problem(seed=1)
    eps = 1e-7
    ends = {beta: trl_loss(hidden, teacher, weight, labels, beta, 1.0)[0] for beta in (0.0, eps, 1 - eps, 1.0)}
    torch.testing.assert_close(ends[eps] / eps, ends[0.0], rtol=1e-3, atol=0)
    torch.testing.assert_close(ends[1 - eps] / eps, ends[1.0], rtol=1e-3, atol=0)


# tinker-cookbook, on-policy distillation -------------------------------------------------------------------------


def _tinker_cookbook_kl_advantage(advantages, sampled_logprobs, teacher_logprobs, mask, kl_penalty_coef,
                                  kl_discount_factor=0.0):
    """tinker-cookbook's incorporate_kl_penalty for one datum (train_on_policy.py at 53aaf8de, lines 85-104), with
    `teacher_logprobs` as its teacher client's compute_logprobs_async returns them: one per token of the full
    sequence (model input + the last target), the first (no context) dropped by `[1:]`.

        reverse_kl = (sampled_logprobs - torch.tensor(teacher_logprobs[1:])) * mask          # lines 85-90
        kl_advantages = -kl_penalty_coef * float_masks[i] * reverse_kl[i]                    # line 97
        advantages = advantages + kl_advantages                                              # lines 102-104
    """
    if kl_discount_factor > 0:
        raise NotImplementedError("only kl_discount_factor 0 (seedfast has no discounted form)")
    float_mask = mask.float()
    reverse_kl = (sampled_logprobs - torch.tensor(teacher_logprobs[1:])) * float_mask
    kl_advantages = -kl_penalty_coef * float_mask * reverse_kl
    return advantages + kl_advantages


@pytest.mark.parametrize("coef", [1.0, 0.3])
def test_advantage_shift_equals_tinker_cookbook_kl_penalty(coef):
    """With the clip out of reach, seedfast's `advantage` form λ·m·clip(ℓskill − ℓold) is tinker-cookbook's
    advantage change −λ·m·(ℓold − ℓteacher) at kl_discount_factor 0 (its sampled log-probs are the behaviour
    policy's, our ℓold; its teacher's log-probs, our ℓskill)."""
    gen = torch.Generator().manual_seed(3)
    for length in (1, 5, 12):  # fp32, as tinker's TensorData and its torch.tensor(teacher_logprobs[1:]) are
        old = -8.0 * torch.rand(length, generator=gen)
        teacher = -8.0 * torch.rand(length, generator=gen)
        mask = torch.rand(length, generator=gen) > 0.3
        teacher_full = [0.0, *teacher.tolist()]  # compute_logprobs_async: the first token has no log-prob
        ours = opd_advantage_shift(teacher, old, mask, coef, clip=1e30)
        # From zero advantages the change is exact (the same products, a sign flipped); from others, to rounding.
        theirs = _tinker_cookbook_kl_advantage(torch.zeros(length), old, teacher_full, mask, coef)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
        advantages = torch.randn(length, generator=gen)
        theirs = _tinker_cookbook_kl_advantage(advantages, old, teacher_full, mask, coef) - advantages
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)


def test_advantage_shift_clips_where_tinker_cookbook_does_not():
    """The one difference: seedfast clips |ℓskill − ℓold| at opd_adv_clip (default 3 nats); tinker-cookbook does not."""
    old = torch.tensor([-1.0, -1.0, -9.0, -2.0])
    teacher = torch.tensor([-2.0, -8.0, -1.0, -2.5])
    mask = torch.tensor([True, True, True, False])
    theirs = _tinker_cookbook_kl_advantage(torch.zeros(4), old, [0.0, *teacher.tolist()], mask, 0.5)
    ours = opd_advantage_shift(teacher, old, mask, 0.5, clip=3.0)
    torch.testing.assert_close(ours, torch.tensor([-0.5, -1.5, 1.5, 0.0]))
    torch.testing.assert_close(theirs, torch.tensor([-0.5, -3.5, 4.0, 0.0]))
