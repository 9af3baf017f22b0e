"""The teacher's evidence metrics (train/teacher_evidence.py) on hand-built samples and through the update."""


import pytest
import torch

from seedfast.algo.losses import LossOptions
from seedfast.config import LossConfig
from seedfast.context.sample import StepSample
from seedfast.model.decoder import build_decoder
from seedfast.scoring import score
from seedfast.train.teacher_evidence import TeacherEvidence, policy_gradient_weight
from seedfast.train.update import UpdateBatch, minibatch_loss_backward
from tests.scoring.scoring_helpers import make_config, random_samples


def test_contrast_and_raised_shares_split_winners_and_losers_over_teacher_valid_tokens():
    won = StepSample(prompt_ids=[1, 2], response_ids=[3, 4], reward=0.9, penalty=0.1)  # outcome 1
    lost = StepSample(prompt_ids=[1, 2], response_ids=[5, 6, 7], reward=-0.1, penalty=0.1)  # outcome 0
    logprob = torch.tensor([-1.0, -2.0, -1.0, -1.0, -3.0])
    teacher = torch.tensor([-0.5, -1.0, -2.0, 0.0, -1.0])  # Δ = +0.5, +1.0 | −1.0, (+1.0 masked), +2.0
    mask = torch.tensor([True, True, True, False, True])
    evidence = TeacherEvidence()
    evidence.add_contrast(logprob, teacher, mask, [won, lost])
    evidence.add_contrast(torch.tensor([-1.0, -1.0]), torch.tensor([-1.5, -1.0]), torch.tensor([True, True]), [won])
    out = evidence.metrics()
    assert out["teacher/delta_win"] == pytest.approx((0.5 + 1.0 - 0.5 + 0.0) / 4)
    assert out["teacher/delta_lose"] == pytest.approx((-1.0 + 2.0) / 2)
    assert out["teacher/contrast"] == pytest.approx(0.25 - 0.5)
    assert out["teacher/raised_win"] == pytest.approx(2 / 4)  # Δ = 0 is not raised
    assert out["teacher/raised_lose"] == pytest.approx(1 / 2)
    assert "teacher/opd_share" not in out  # no update ran
    assert TeacherEvidence().metrics() == {}  # no teacher-valid token: no metric


def test_no_contrast_without_both_winners_and_losers():
    won = StepSample(prompt_ids=[1], response_ids=[3], reward=1.0)
    evidence = TeacherEvidence()
    evidence.add_contrast(torch.tensor([-1.0]), torch.tensor([-0.5]), torch.tensor([True]), [won])
    assert set(evidence.metrics()) == {"teacher/delta_win", "teacher/raised_win"}


def test_policy_gradient_weight_by_hand():
    options = LossOptions(clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    w = torch.tensor([0.5, 0.25, 0.25, 0.0])
    adv = torch.tensor([1.0, -2.0, 0.5, 7.0])
    # on-policy every ratio is 1: |∂pg/∂ℓθ| = |A|; the weight-0 token counts for nothing
    assert policy_gradient_weight(torch.zeros(4), None, adv, w, options) == pytest.approx(0.5 + 0.5 + 0.125)
    # off-policy: ρ = 1.5 with A > 0 is clipped (gradient 0); ρ = 0.5 with A < 0 is clipped too (−A·0.8 > −A·0.5);
    # ρ = 1.1 with A = 0.5 is inside the clip range: |A·ρ| = 0.55
    old = torch.log(torch.tensor([1 / 1.5, 2.0, 1 / 1.1, 1.0]))
    assert policy_gradient_weight(torch.zeros(4), old, adv, w, options) == pytest.approx(0.25 * 0.55)


def test_opd_share_is_the_teachers_part_of_the_gradient_weight():
    evidence = TeacherEvidence()
    evidence.add_gradient_weights(opd=0.1, pg=0.3)
    evidence.add_gradient_weights(opd=0.1, pg=0.0)  # a mini-batch of all-fail groups: the teacher alone moves it
    assert evidence.metrics()["teacher/opd_share"] == pytest.approx(0.2 / 0.5)


def _labelled(samples):
    """`samples` with alternate outcomes: even ones won."""
    return [StepSample(prompt_ids=s.prompt_ids, response_ids=s.response_ids, insertions=s.insertions,
                       teacher_drops=s.teacher_drops, teacher_valid=s.teacher_valid, sample_id=i,
                       reward=float(i % 2 == 0)) for i, s in enumerate(samples)]


@pytest.mark.parametrize("budget", [4096, 40])
def test_the_updates_evidence_equals_a_hand_computation_from_the_scoring_pass(budget):
    """On-policy with the teacher scored by the update's forward: the contrast equals the one from the separate
    scoring pass (the same parameters), and opd_share equals λΣw·m·σ(βΔ) / (λΣw·m·σ(βΔ) + Σw·|A|)."""
    model = build_decoder(make_config("qwen3"), dtype=torch.float64, seed=3)
    samples = _labelled(random_samples(torch.Generator().manual_seed(7), n=12))
    advantages = torch.linspace(-1.0, 1.0, len(samples), dtype=torch.float64)
    loss_cfg = LossConfig(opd_coef=0.3, opd_beta=2.0, entropy_coef=0.0, kl_coef=0.0)
    scores = score(model, samples, temperature=1.0)

    expected = TeacherEvidence()
    expected.add_contrast(scores.logprob, scores.teacher_logprob, scores.teacher_mask, samples)
    expected_metrics = expected.metrics()
    assert {"teacher/contrast", "teacher/raised_win", "teacher/raised_lose"} <= set(expected_metrics)

    evidence = TeacherEvidence()
    minibatch_loss_backward(model, UpdateBatch(samples, advantages, None, teacher_from_forward=True),
                            list(range(len(samples))), loss_cfg, use_kl=False, use_opd=True, temperature=1.0,
                            token_budget=budget, evidence=evidence, first_look=True)
    out = evidence.metrics()
    for key, value in expected_metrics.items():
        assert out[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key  # the update returns ℓθ in fp32

    lengths = torch.tensor([len(s.response_ids) for s in samples])
    w = 1.0 / float(lengths.sum())  # token-mean
    adv = torch.repeat_interleave(advantages, lengths)
    gate = torch.sigmoid(2.0 * (scores.teacher_logprob - scores.logprob))
    opd = 0.3 * w * float(torch.where(scores.teacher_mask, gate, 0.0).sum())
    pg = w * float(adv.abs().sum())
    assert out["teacher/opd_share"] == pytest.approx(opd / (opd + pg), rel=1e-6)  # the loss sums in fp32

    later = TeacherEvidence()  # a later epoch's forward: the gradient weights only, no second look at Δ
    minibatch_loss_backward(model, UpdateBatch(samples, advantages, None, teacher_from_forward=True),
                            list(range(len(samples))), loss_cfg, use_kl=False, use_opd=True, temperature=1.0,
                            token_budget=budget, evidence=later, first_look=False)
    assert set(later.metrics()) == {"teacher/opd_share"}
