"""The masking rule of the rollout correction (docs/algorithms.md, 'Rollout correction'), on a hand-made batch: a token
whose correction weight is 0 leaves every term of the loss (policy, KL, entropy, teacher: its hidden row gets no
gradient at all), and stays in the aggregation's denominator (every other token's gradient is what it is when that
token is kept), whatever the aggregation and the teacher term's form."""

from __future__ import annotations

import pytest
import torch

import seedfast.train.update as update
from seedfast.config import LossConfig
from seedfast.model.decoder import build_decoder
from seedfast.scoring import score
from seedfast.train.update import UpdateBatch, minibatch_loss_backward
from tests.scoring.scoring_helpers import make_config, random_samples

TEMPERATURE = 1.0


def _row_grads(model, batch: UpdateBatch, loss_cfg: LossConfig, monkeypatch) -> dict:
    """∂L/∂(the final hidden row of each response token), per (sample_id, token): the row feeds the LM head at its
    position alone, so its gradient is that token's part of the loss, every term together."""
    got: dict = {}
    original = update.response_rows

    def rows_with_hook(model_, samples, **kw):
        rows, targets, kv = original(model_, samples, **kw)
        rows.retain_grad()

        def keep(grad, samples=samples):
            at = 0
            for s in samples:
                for t in range(len(s.response_ids)):
                    got[(s.sample_id, t)] = grad[at].detach().clone()
                    at += 1
        rows.register_hook(keep)
        return rows, targets, kv

    monkeypatch.setattr(update, "response_rows", rows_with_hook)
    model.zero_grad(set_to_none=True)
    minibatch_loss_backward(model, batch, list(range(len(batch.samples))), loss_cfg, use_kl=True, use_opd=True,
                            temperature=TEMPERATURE, token_budget=4096)
    monkeypatch.setattr(update, "response_rows", original)
    return got


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("opd_mode", ["gate", "advantage", "reverse_kl"])
def test_a_masked_token_leaves_every_term_and_stays_in_the_denominator(agg, opd_mode, monkeypatch):
    torch.manual_seed(0)
    model = build_decoder(make_config("qwen3"), dtype=torch.float32, seed=1)
    samples = random_samples(torch.Generator().manual_seed(3), n=6)
    scores = score(model, samples, temperature=TEMPERATURE)
    n = scores.logprob.numel()
    gen = torch.Generator().manual_seed(4)
    old = scores.logprob + 0.2 * torch.randn(n, generator=gen)
    ref = scores.logprob + 0.3 * torch.randn(n, generator=gen)
    teacher = scores.logprob + 0.5 * torch.randn(n, generator=gen)
    teacher_mask = torch.rand(n, generator=gen) < 0.8
    hidden = torch.randn(n, model.lm_head_weight.shape[1], generator=gen)
    # weights: TIS-like values, every third token masked, and sample 2 masked whole
    weight = 0.5 + torch.rand(n, generator=gen)
    weight[::3] = 0.0
    weight[scores.offsets[2]:scores.offsets[3]] = 0.0
    masked = weight == 0
    assert 0 < int(masked.sum()) < n
    stand_in = torch.where(masked, torch.full_like(weight, 0.7), weight)  # the same tokens, kept
    loss_cfg = LossConfig(kl_coef=0.1, entropy_coef=0.05, opd_coef=0.3, opd_mode=opd_mode, agg=agg)
    adv = torch.linspace(-1.0, 1.5, len(samples))

    def batch(w):
        return UpdateBatch(samples, adv, old, ref_logprob=ref, teacher_logprob=teacher, teacher_mask=teacher_mask,
                           pg_weight=w, teacher_hidden=hidden)

    with_mask = _row_grads(model, batch(weight), loss_cfg, monkeypatch)
    kept_all = _row_grads(model, batch(stand_in), loss_cfg, monkeypatch)
    assert with_mask.keys() == kept_all.keys() and len(with_mask) == n
    flat = {}
    for i, s in enumerate(samples):
        for t in range(len(s.response_ids)):
            flat[(s.sample_id, t)] = int(scores.offsets[i]) + t
    for key, k in flat.items():
        if masked[k]:
            assert torch.count_nonzero(with_mask[key]) == 0, f"masked token {key} still has a gradient"
            assert torch.count_nonzero(kept_all[key]) > 0  # it has one when kept (KL, entropy, teacher)
        else:  # the same aggregation weight: the masked tokens still count in the denominators
            torch.testing.assert_close(with_mask[key], kept_all[key], rtol=1e-6, atol=1e-9,
                                       msg=lambda m, key=key: f"kept token {key}: {m}")


def test_a_batch_masked_whole_has_no_loss_and_no_gradient():
    model = build_decoder(make_config("qwen3"), dtype=torch.float32, seed=1)
    samples = random_samples(torch.Generator().manual_seed(3), n=4)
    scores = score(model, samples, temperature=TEMPERATURE)
    n = scores.logprob.numel()
    batch = UpdateBatch(samples, torch.ones(len(samples)), scores.logprob, ref_logprob=scores.logprob - 0.3,
                        teacher_logprob=scores.logprob + 0.4, teacher_mask=torch.ones(n, dtype=torch.bool),
                        pg_weight=torch.zeros(n))
    assert batch.kept_tokens(list(range(4))) == 0
    model.zero_grad(set_to_none=True)
    loss, _ = minibatch_loss_backward(model, batch, list(range(4)), LossConfig(kl_coef=0.1, entropy_coef=0.05),
                                      use_kl=True, use_opd=True, temperature=TEMPERATURE, token_budget=4096)
    assert loss == 0.0
    assert all(p.grad is None or torch.count_nonzero(p.grad) == 0 for p in model.parameters())
