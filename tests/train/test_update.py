"""The policy update: ℓskill from the update's own forward equals ℓskill from the separate scoring pass."""


import pytest
import torch

from seedfast.config import LossConfig
from seedfast.model.decoder import build_decoder
from seedfast.scoring import score
from seedfast.train.update import UpdateBatch, minibatch_loss_backward
from tests.scoring.scoring_helpers import make_config, random_samples

LOSS = LossConfig(opd_coef=0.5, opd_beta=2.0, entropy_coef=0.0)


def _loss_and_grads(model, batch, budget):
    model.zero_grad(set_to_none=True)
    loss, metrics = minibatch_loss_backward(model, batch, list(range(len(batch.samples))), LOSS, use_kl=False,
                                            use_opd=True, temperature=1.2, token_budget=budget)
    return loss, metrics, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("budget", [4096, 40])  # one micro-batch, and several
def test_teacher_from_the_update_forward_equals_the_scored_teacher(budget):
    model = build_decoder(make_config("qwen3"), dtype=torch.float32, seed=3)
    samples = random_samples(torch.Generator().manual_seed(7), n=12)
    advantages = torch.linspace(-1.0, 1.0, len(samples))
    scores = score(model, samples, temperature=1.2)
    assert bool(scores.teacher_mask.any()) and not bool(scores.teacher_mask.all())

    scored = UpdateBatch(samples, advantages, None, teacher_logprob=scores.teacher_logprob,
                         teacher_mask=scores.teacher_mask)
    in_update = UpdateBatch(samples, advantages, None, teacher_from_forward=True)
    loss_a, metrics_a, grads_a = _loss_and_grads(model, scored, budget)
    loss_b, metrics_b, grads_b = _loss_and_grads(model, in_update, budget)

    assert metrics_a["opd_term"] != 0.0
    assert loss_b == pytest.approx(loss_a, rel=1e-5, abs=1e-7)
    for key in ("opd_term", "gate_mean", "clip_frac"):
        assert metrics_b[key] == pytest.approx(metrics_a[key], rel=1e-5, abs=1e-7), key
    assert grads_a.keys() == grads_b.keys()
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_teacher_from_forward_refuses_a_second_teacher():
    samples = random_samples(torch.Generator().manual_seed(1), n=3)
    n = sum(len(s.response_ids) for s in samples)
    with pytest.raises(ValueError, match="teacher_from_forward"):
        UpdateBatch(samples, torch.zeros(3), None, teacher_logprob=torch.zeros(n), teacher_from_forward=True)


def _sgd_step(model, batch, loss_cfg, use_opd, lr=0.05):
    model.zero_grad(set_to_none=True)
    minibatch_loss_backward(model, batch, list(range(len(batch.samples))), loss_cfg, use_kl=False,
                            use_opd=use_opd, temperature=1.0, token_budget=4096)
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= lr * p.grad


def _response_logprob(model, samples):
    scores = score(model, samples)
    return [float(scores.logprob[scores.offsets[i]:scores.offsets[i + 1]].sum()) for i in range(len(samples))]


def test_an_update_makes_rewarded_actions_likelier_and_punished_ones_rarer():
    """The sign, end to end: advantages → fused loss → gradients → parameters → log-probs."""
    from seedfast.scoring import StepSample

    model = build_decoder(make_config("qwen3"), dtype=torch.float32, seed=11)
    prompt = torch.tensor([5, 9, 2, 7, 3])
    good, bad = torch.tensor([4, 8]), torch.tensor([6, 1])
    samples = [StepSample(prompt_ids=prompt, response_ids=good, sample_id=0),
               StepSample(prompt_ids=prompt, response_ids=bad, sample_id=1)]
    before = _response_logprob(model, samples)
    _sgd_step(model, UpdateBatch(samples, torch.tensor([1.0, -1.0]), None), LossConfig(kl_coef=0.0), use_opd=False)
    after = _response_logprob(model, samples)
    assert after[0] > before[0] + 1e-3 and after[1] < before[1] - 1e-3


def test_the_opd_term_raises_the_likelihood_of_what_the_skill_supports_and_nothing_without_a_skill():
    """Zero advantage: the OPD term (docs/algorithms.md) alone moves ℓθ, upwards (gradient −g per token), and a
    sample whose skill failed (teacher mask 0) leaves the parameters untouched."""
    from seedfast.scoring import StepSample

    prompt, response, skill = torch.tensor([5, 9, 2, 7, 3]), torch.tensor([4, 8]), torch.tensor([11, 12, 13])
    loss_cfg = LossConfig(kl_coef=0.0, entropy_coef=0.0, opd_coef=1.0, opd_beta=5.0)
    for valid in (True, False):
        model = build_decoder(make_config("qwen3"), dtype=torch.float32, seed=12)
        sample = StepSample(prompt_ids=prompt, response_ids=response, sample_id=0, insert_at=5,
                            privileged_ids=skill, teacher_valid=valid)
        params = [p.detach().clone() for p in model.parameters()]
        before = float(score(model, [sample]).logprob.sum())
        _sgd_step(model, UpdateBatch([sample], torch.zeros(1), None, teacher_from_forward=True), loss_cfg,
                  use_opd=True)
        after = float(score(model, [sample]).logprob.sum())
        if valid:
            assert after > before + 1e-3
        else:
            assert all(torch.equal(p, q) for p, q in zip(model.parameters(), params))


def _user_facing(key: str) -> bool:
    """A name a person reads in metrics.jsonl / TensorBoard: no `_`-prefixed part (internal bookkeeping)."""
    return not any(part.startswith("_") for part in key.split("/"))


def test_the_update_returns_only_user_facing_metrics():
    """Every sum the update keeps for itself (weights, gap sums) stays out of its metrics, whatever terms run: KL,
    entropy, OPD with a teacher, the rollout gap (the teacher's evidence is the caller's: test_teacher_evidence.py)."""
    model = build_decoder(make_config("qwen3"), dtype=torch.float32, seed=3)
    from seedfast.scoring import StepSample

    samples = [StepSample(prompt_ids=s.prompt_ids, response_ids=s.response_ids, insertions=s.insertions,
                          teacher_drops=s.teacher_drops, teacher_valid=s.teacher_valid, sample_id=i,
                          reward=float(i % 2), meta={"rollout_logprobs": torch.full((len(s.response_ids),), -1.0)})
               for i, s in enumerate(random_samples(torch.Generator().manual_seed(7), n=8))]
    n = sum(len(s.response_ids) for s in samples)
    scores = score(model, samples, temperature=1.0)
    batch = UpdateBatch(samples, torch.linspace(-1.0, 1.0, len(samples)), None, ref_logprob=torch.full((n,), -2.0),
                        teacher_logprob=scores.teacher_logprob, teacher_mask=scores.teacher_mask)
    loss_cfg = LossConfig(kl_coef=0.1, entropy_coef=0.01, opd_coef=0.5)
    _, metrics = minibatch_loss_backward(model, batch, list(range(len(samples))), loss_cfg, use_kl=True,
                                         use_opd=True, temperature=1.0, token_budget=40)
    assert {"kl", "entropy", "gate_mean", "opd_term", "loss", "rollout/logprob_gap_mean"} <= set(metrics)
    assert [k for k in metrics if not _user_facing(k)] == []
