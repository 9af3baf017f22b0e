"""The rollout correction in the update (docs/algorithms.md, 'Rollout correction'): the weight folded into the
advantages gives the parameter gradients of the weighted PPO term computed independently (fp64 materialized
log-softmax, the term written out by hand), mode none changes nothing, missing behaviour log-probs are refused or
counted, and a run that masks more than rollout.correction.warn_masked_share says so."""

import math
import warnings

import pytest
import torch

from seedfast.config import CorrectionConfig, LossConfig, load_config
from seedfast.model.decoder import build_decoder
from seedfast.scoring import score
from seedfast.scoring.shared_prompts import response_rows
from seedfast.train.correction import (
    MaskedShareWarning,
    correction_weights,
    warn_if_masked,
)
from seedfast.train.update import UpdateBatch, minibatch_loss_backward
from tests.scoring.scoring_helpers import make_config, random_samples

LOSS = LossConfig(kl_coef=0.0, entropy_coef=0.0, opd_coef=0.0)
TEMPERATURE = 1.3


def _setup(seed=5, n=10, noise=0.4):
    """A tiny decoder, samples whose behaviour log-probs are θ's plus noise (a mismatched engine), θ_old's scores."""
    model = build_decoder(make_config("qwen3"), dtype=torch.float32, seed=seed)
    samples = random_samples(torch.Generator().manual_seed(seed), n=n)
    scores = score(model, samples, temperature=TEMPERATURE)
    gen = torch.Generator().manual_seed(seed + 1)
    for i, s in enumerate(samples):
        own = scores.logprob[scores.offsets[i]:scores.offsets[i + 1]]
        s.meta["rollout_logprobs"] = own + noise * torch.randn(own.shape, generator=gen)
    return model, samples, scores


def _grads(model, batch, budget=4096):
    model.zero_grad(set_to_none=True)
    loss, metrics = minibatch_loss_backward(model, batch, list(range(len(batch.samples))), LOSS, use_kl=False,
                                            use_opd=False, temperature=TEMPERATURE, token_budget=budget)
    return loss, metrics, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _reference_grads(model, samples, old, advantages, weight):
    """Σ_t (1/N)·w_t·pg_t over a fp64 log-softmax of the materialized logits, pg written out by hand."""
    model.zero_grad(set_to_none=True)
    rows, targets, _ = response_rows(model, samples, share_prompts=False)
    logits = rows.double() @ model.lm_head_weight.double().T / TEMPERATURE
    logprob = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
    ratio = torch.exp(logprob - old.double())
    adv = advantages.double()
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - LOSS.clip_low, 1 + LOSS.clip_high))
    pg = torch.where(adv < 0, torch.minimum(pg, -adv * LOSS.dual_clip), pg)
    loss = (weight.double() * pg).sum() / len(pg)
    loss.backward()
    return float(loss.detach()), {n: p.grad.double() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("mode", ["token_tis", "seq_tis", "token_mask", "seq_geo_mask"])
@pytest.mark.parametrize("budget", [4096, 40])  # one micro-batch, and several
def test_the_weighted_update_equals_the_weighted_ppo_term_in_fp64(mode, budget):
    model, samples, scores = _setup()
    correction = CorrectionConfig(mode=mode, geo_low=0.8, geo_high=1.25, token_high=1.5)
    weight, tally = correction_weights(scores.logprob, samples, correction)
    metrics = tally.metrics()
    assert 0 < metrics["rollout_corr/weight_mean"] and weight.shape == scores.logprob.shape
    adv = torch.linspace(-1.5, 1.0, len(samples))
    per_token_adv = torch.repeat_interleave(adv, torch.tensor([len(s.response_ids) for s in samples]))
    # ℓold a little off θ so that some ratios clip
    old = scores.logprob + 0.3 * torch.randn(scores.logprob.shape, generator=torch.Generator().manual_seed(2))
    loss, _, grads = _grads(model, UpdateBatch(samples, adv, old, pg_weight=weight), budget)
    ref_loss, ref_grads = _reference_grads(model, samples, old, per_token_adv, weight)
    assert loss == pytest.approx(ref_loss, rel=1e-4, abs=1e-6)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g.double(), ref_grads[name].double(), rtol=2e-3, atol=2e-6,
                                   msg=lambda m, name=name: f"{name}: {m}")
    _, unweighted = _reference_grads(model, samples, old, per_token_adv, torch.ones_like(weight))
    assert any(not torch.allclose(g.double(), unweighted[n], rtol=1e-2, atol=1e-5) for n, g in grads.items()), \
        "the weight changed no gradient"


def test_mode_none_gives_no_weight_and_a_weight_of_one_changes_no_bit():
    model, samples, scores = _setup()
    weight, tally = correction_weights(scores.logprob, samples, CorrectionConfig())
    assert weight is None
    assert tally.metrics()["rollout/logprob_gap_mean"] > 0.1  # the diagnostics are there with mode none too
    adv = torch.linspace(-1.0, 1.0, len(samples))
    loss_a, metrics_a, grads_a = _grads(model, UpdateBatch(samples, adv, scores.logprob))
    loss_b, metrics_b, grads_b = _grads(model, UpdateBatch(samples, adv, scores.logprob,
                                                           pg_weight=torch.ones_like(scores.logprob)))
    assert loss_a == loss_b and metrics_a == metrics_b
    assert all(torch.equal(grads_a[n], grads_b[n]) for n in grads_a)


def test_the_tally_of_a_scoring_pass_by_hand():
    samples = random_samples(torch.Generator().manual_seed(0), n=2)
    lengths = [len(s.response_ids) for s in samples]
    train = torch.linspace(-2.0, -0.5, sum(lengths))
    shift = [0.2, -0.1]  # every token of sample i: ℓrollout = ℓtrain − shift_i, so log ρ = shift_i
    parts = train.split(lengths)
    for s, part, d in zip(samples, parts, shift):
        s.meta["rollout_logprobs"] = part - d
    weight, tally = correction_weights(train, samples, CorrectionConfig(mode="token_tis", token_clip=1.1))
    expected = torch.cat([torch.full((n,), min(math.exp(d), 1.1)) for n, d in zip(lengths, shift)])
    torch.testing.assert_close(weight, expected)
    m = tally.metrics()
    n = sum(lengths)
    assert m["rollout/logprob_gap_mean"] == pytest.approx((0.2 * lengths[0] + 0.1 * lengths[1]) / n)
    assert m["rollout/logprob_gap_max"] == pytest.approx(0.2)
    assert m["rollout_corr/k3_kl"] == pytest.approx(
        sum(k * (math.exp(d) - 1 - d) for k, d in zip(lengths, shift)) / n)
    assert m["rollout_corr/training_ppl"] == pytest.approx(sum(math.exp(-float(p.mean())) for p in parts) / 2)
    assert m["rollout_corr/rollout_ppl"] == pytest.approx(
        sum(math.exp(-float(p.mean()) + d) for p, d in zip(parts, shift)) / 2)
    assert m["rollout_corr/token_truncated_share"] == pytest.approx(lengths[0] / n)  # e^0.2 > 1.1
    assert m["rollout_corr/seq_truncated_share"] == 0.5
    assert m["rollout_corr/token_masked_share"] == 0.0


def test_missing_behaviour_logprobs_are_refused_by_a_mode_and_counted_by_none():
    model, samples, scores = _setup(n=4)
    del samples[2].meta["rollout_logprobs"]
    with pytest.raises(ValueError, match=r"rollout.correction.mode=token_tis: sample 2 carries no behaviour"):
        correction_weights(scores.logprob, samples, CorrectionConfig(mode="token_tis"))
    weight, tally = correction_weights(scores.logprob, samples, CorrectionConfig())
    m = tally.metrics()
    assert weight is None and m["rollout_corr/samples_without_logprobs"] == 1.0
    assert m["rollout_corr/training_ppl"] > 0  # the other three samples


def test_behaviour_logprobs_of_the_wrong_length_are_refused():
    _, samples, scores = _setup(n=3)
    samples[1].meta["rollout_logprobs"] = torch.zeros(len(samples[1].response_ids) + 1)
    with pytest.raises(ValueError, match="sample 1: behaviour log-probs have shape"):
        correction_weights(scores.logprob, samples, CorrectionConfig())


@pytest.mark.parametrize("unit", ["trajectory", "step"])
def test_seq_modes_weigh_the_whole_trajectory_or_each_step(unit):
    """Samples 0, 1, 2 are the steps of trajectory 7, sample 3 its own trajectory (and a sample that names none is
    one of its own): with seq_unit trajectory every step of trajectory 7 has exp(Σ of all its log ratios)."""
    samples = random_samples(torch.Generator().manual_seed(1), n=5)
    lengths = [len(s.response_ids) for s in samples]
    train = torch.linspace(-2.0, -0.5, sum(lengths))
    shift = [0.1, -0.3, 0.05, 0.2, 0.15]  # log ρ of every token of sample i
    for s, part, d, traj in zip(samples, train.split(lengths), shift, [7, 7, 7, 8, None]):
        s.meta["rollout_logprobs"] = part - d
        if traj is not None:
            s.meta["trajectory_index"] = traj
    weight, _ = correction_weights(train, samples, CorrectionConfig(mode="seq_tis", seq_clip=100.0, seq_unit=unit))
    logs = [n * d for n, d in zip(lengths, shift)]
    if unit == "trajectory":
        per_sample = [math.exp(sum(logs[:3]))] * 3 + [math.exp(logs[3]), math.exp(logs[4])]
    else:
        per_sample = [math.exp(x) for x in logs]
    expected = torch.cat([torch.full((n,), w) for n, w in zip(lengths, per_sample)])
    torch.testing.assert_close(weight, expected)


def test_the_warning_names_the_shares_and_comes_above_the_threshold_only():
    metrics = {"rollout_corr/token_masked_share": 0.25, "rollout_corr/seq_masked_share": 0.65}
    with pytest.warns(MaskedShareWarning, match=r"step 7: .* masked 25.0% of the response tokens and 65.0% of the "
                                                r"sequences \(above rollout.correction.warn_masked_share=0.6\)"):
        assert warn_if_masked(metrics, 0.6, step=7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not warn_if_masked(metrics, 0.7, step=7)
        assert not warn_if_masked({}, 0.0, step=7)


def test_bad_bounds_name_the_key():
    with pytest.raises(ValueError, match=r"rollout.correction.geo_low=1.2 is above rollout.correction.geo_high=1.01"):
        load_config(None, ["rollout.correction.geo_low=1.2"])
    with pytest.raises(ValueError, match=r"rollout.correction.mode: 'tis' is not allowed"):
        load_config(None, ["rollout.correction.mode=tis"])


@pytest.mark.filterwarnings("ignore::seedfast.config.ConfigWarning")
def test_a_run_logs_the_diagnostics_and_a_run_that_masks_everything_warns(overrides, tiny_policy, train_games,
                                                                          tmp_path):
    from seedfast.train.rl import Trainer

    moved = {}

    def run(*extra):
        cfg = load_config(None, [*overrides(train_games, tmp_path / extra[0].split("=")[1]), "algorithm=grpo",
                                 "trainer.steps=1", "trainer.eval_every=0", *extra])
        trainer = Trainer(cfg, policy_dir=tiny_policy)
        start = {k: v.clone() for k, v in trainer.trained.state_dict().items()}
        try:
            return trainer.run()[0]
        finally:
            moved[extra[0]] = any(not torch.equal(v, start[k]) for k, v in trainer.trained.state_dict().items())
            trainer.close()

    row = run("rollout.correction.mode=token_tis")
    # the own engine in fp32 samples with the trainer's numbers: the gap is rounding, every weight ~1
    assert row["rollout/logprob_gap_max"] < 1e-4
    assert row["rollout_corr/weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert row["rollout_corr/token_masked_share"] == 0.0 and "rollout_corr/masked_share_warning" not in row
    assert row["train/skipped_all_masked"] == 0.0 and row["optim/updates_applied"] == 1.0
    assert row["rollout_corr/training_ppl"] == pytest.approx(row["rollout_corr/rollout_ppl"], rel=1e-4)
    with pytest.warns(MaskedShareWarning, match="masked 100.0% of the response tokens"):
        row = run("rollout.correction.mode=seq_geo_mask", "rollout.correction.geo_low=1.5",
                  "rollout.correction.geo_high=2.0")
    assert row["rollout_corr/token_masked_share"] == row["rollout_corr/seq_masked_share"] == 1.0
    assert row["rollout_corr/masked_share_warning"] == 1.0
    # nothing of the update enters any term: no optimizer step (Adam and the weight decay would move the policy on a
    # zero gradient), counted
    assert row["train/skipped_all_masked"] == 1.0 and row["optim/updates_applied"] == 0.0
    assert "loss/total" not in row and "optim/grad_norm" not in row
    assert moved == {"rollout.correction.mode=token_tis": True, "rollout.correction.mode=seq_geo_mask": False}


@pytest.mark.filterwarnings("ignore::seedfast.config.ConfigWarning")
@pytest.mark.filterwarnings("ignore::seedfast.train.correction.MaskedShareWarning")
def test_an_all_masked_update_says_it_was_skipped_and_leaves_the_lr_schedule_where_it_was(
        overrides, tiny_policy, train_games, tmp_path, one_torch_thread):
    """Two updates the correction masks whole, under a warm-up (lr * (s + 1) / 4 at optimizer step s): each leaves a
    warning and an `update_skipped` event, and both run at the lr of optimizer step 0, as the next real step will."""
    import json

    from seedfast.train.rl import Trainer, UpdateSkippedWarning

    out = tmp_path / "masked"
    cfg = load_config(None, [*overrides(train_games, out), "algorithm=grpo", "trainer.steps=2",
                             "trainer.eval_every=0", "optim.warmup_steps=3", "rollout.correction.mode=seq_geo_mask",
                             "rollout.correction.geo_low=1.5", "rollout.correction.geo_high=2.0"])
    trainer = Trainer(cfg, policy_dir=tiny_policy)
    try:
        with pytest.warns(UpdateSkippedWarning) as said:
            rows = trainer.run()
        schedule_at = trainer.scheduler.last_epoch
    finally:
        trainer.close()
    first_lr = cfg.optim.lr * 1 / 4
    assert [r["optim/updates_applied"] for r in rows] == [0.0, 0.0]
    assert [r["train/skipped_all_masked"] for r in rows] == [1.0, 1.0]
    assert [r["optim/lr"] for r in rows] == pytest.approx([first_lr, first_lr], rel=1e-12)
    assert schedule_at == 0  # no optimizer step, no step of the schedule
    lines = [str(w.message) for w in said if w.category is UpdateSkippedWarning]
    assert [line.split(":")[0] for line in lines] == ["update 0", "update 1"]
    assert all("every response token of 1 mini-batch: the whole update skipped (no optimizer step; the lr "
               "schedule not advanced)" in line for line in lines)
    events = [json.loads(line) for line in (out / "t" / "metrics.jsonl").read_text().splitlines()]
    assert [e for e in events if e.get("event") == "update_skipped"] == [
        {"event": "update_skipped", "update": u, "reason": "all_masked", "mini_batches_skipped": 1,
         "optimizer_steps": 0, "lr_next": pytest.approx(first_lr, rel=1e-12)} for u in (0, 1)]
