"""The forms of the teacher term in a whole update (loss.opd_mode, docs/algorithms.md 'Forms of the teacher term').

- reverse_kl and jsd: the update's gradient of every parameter equals that of λ·token-mean(m·D) written over
  transformers' own model in fp64 (both contexts' logits materialized there, the teacher's under no_grad), with the
  teacher scored in the scoring pass (teacher_params old: its hidden rows kept) and in the update (current);
- advantage: the update equals the plain policy update whose advantages carry λ·m·clip(ℓskill − ℓold) by hand;
- every form moves fp32 weights at the demo recipe's lr, and a divergence form without the teacher's rows is one error.
"""

import dataclasses

import pytest
import torch
import transformers

from seedfast.algo import losses
from seedfast.config import LossConfig
from seedfast.model.decoder import build_decoder
from seedfast.scoring import score
from seedfast.train.update import UpdateBatch, minibatch_loss_backward
from tests.scoring.scoring_helpers import make_config, random_samples

TEMPERATURE = 1.2
LAMBDA = 0.7
PLAIN = dict(entropy_coef=0.0, kl_coef=0.0)


def fp64_twin(model) -> torch.nn.Module:
    """transformers' own model of the family, in fp64, holding `model`'s weights."""
    config = transformers.AutoConfig.for_model(**model.config.to_hf_dict())
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").double().eval()
    result = hf.load_state_dict(model.state_dict(), strict=False)
    assert not result.missing_keys and not result.unexpected_keys
    return hf


def _divergence(log_s: torch.Tensor, log_t: torch.Tensor, mode: str, beta: float) -> torch.Tensor:
    if mode == "reverse_kl" or beta == 1.0:
        return (log_s.exp() * (log_s - log_t)).sum(-1)
    if beta == 0.0:
        return (log_t.exp() * (log_t - log_s)).sum(-1)
    b = torch.tensor(beta, dtype=torch.float64)
    log_m = torch.logsumexp(torch.stack([log_s + torch.log(1 - b), log_t + torch.log(b)]), 0)
    return b * (log_t.exp() * (log_t - log_m)).sum(-1) + (1 - b) * (log_s.exp() * (log_s - log_m)).sum(-1)


def _response_logp(hf, context: torch.Tensor, response: torch.Tensor) -> torch.Tensor:
    ids = torch.cat([context, response])[None]
    logits = hf(ids).logits[0].double() / TEMPERATURE
    rows = torch.arange(len(context) - 1, ids.shape[1] - 1)
    return torch.log_softmax(logits[rows], -1)


def reference_gradients(model, samples, mode: str, beta: float) -> dict[str, torch.Tensor]:
    """∂/∂θ of λ·Σ_t m_t·D_t / (response tokens), over transformers' fp64 model holding the same weights."""
    hf = fp64_twin(model)
    n_tokens = sum(len(s.response_ids) for s in samples)
    total = torch.zeros((), dtype=torch.float64)
    for s in samples:
        if not s.has_teacher:
            continue
        response = torch.as_tensor(s.response_ids)
        log_s = _response_logp(hf, s.prompt_ids, response)
        with torch.no_grad():
            log_t = _response_logp(hf, s.teacher_prompt_ids(), response)
        total = total + _divergence(log_s, log_t, mode, beta).sum()
    (LAMBDA * total / n_tokens).backward()
    return {name: p.grad for name, p in hf.named_parameters()}


@pytest.mark.parametrize(("mode", "beta"), [("reverse_kl", 0.5), ("jsd", 0.5), ("jsd", 0.0)])
@pytest.mark.parametrize("teacher_params", ["old", "current"])
def test_a_divergence_form_is_the_gradient_of_its_fp64_materialized_loss(mode, beta, teacher_params):
    model = build_decoder(make_config("qwen3"), dtype=torch.float64, seed=5)
    samples = random_samples(torch.Generator().manual_seed(7), n=8)
    zero = torch.zeros(len(samples), dtype=torch.float64)  # A = 0 on-policy: the teacher term alone
    if teacher_params == "current":
        batch = UpdateBatch(samples, zero, None, teacher_from_forward=True)
    else:
        scores = score(model, samples, temperature=TEMPERATURE, keep_teacher_hidden=True)
        batch = UpdateBatch(samples, zero, None, teacher_logprob=scores.teacher_logprob,
                            teacher_mask=scores.teacher_mask, teacher_hidden=scores.teacher_hidden)
    cfg = LossConfig(opd_coef=LAMBDA, opd_mode=mode, opd_jsd_beta=beta, **PLAIN)
    _, metrics = minibatch_loss_backward(model, batch, list(range(len(samples))), cfg, use_kl=False, use_opd=True,
                                         temperature=TEMPERATURE, token_budget=4096)
    want = reference_gradients(model, samples, mode, beta)
    got = dict(model.named_parameters())
    assert set(want) == set(got)
    for name, grad in want.items():
        err = float((got[name].grad - grad).abs().max() / grad.abs().max())
        assert err < 5e-5, (name, err)  # the LM head runs in fp32 (its tiles), the model in fp64: ~5e-6
    assert metrics["opd_term"] > 0  # a divergence between distinct contexts


def test_the_advantage_form_is_the_policy_update_with_the_shift_added_by_hand():
    samples = random_samples(torch.Generator().manual_seed(9), n=8)
    models = [build_decoder(make_config("llama"), dtype=torch.float64, seed=3) for _ in range(2)]
    scores = score(models[0], samples, temperature=TEMPERATURE)
    advantages = torch.linspace(-1.0, 1.0, len(samples), dtype=torch.float64)
    old = scores.logprob + 0.05  # off-policy ratios, so the clip is in play
    clip = 0.4
    cfg = LossConfig(opd_coef=LAMBDA, opd_mode="advantage", opd_adv_clip=clip, **PLAIN)
    batch = UpdateBatch(samples, advantages, old, teacher_logprob=scores.teacher_logprob,
                        teacher_mask=scores.teacher_mask)
    _, metrics = minibatch_loss_backward(models[0], batch, list(range(len(samples))), cfg, use_kl=False,
                                         use_opd=True, temperature=TEMPERATURE, token_budget=4096)
    by_hand = torch.repeat_interleave(advantages, torch.tensor([len(s.response_ids) for s in samples]))
    delta = (scores.teacher_logprob.double() - old).clamp(-clip, clip)
    by_hand = by_hand + LAMBDA * torch.where(scores.teacher_mask, delta, 0.0)
    plain = UpdateBatch(samples, by_hand, old)
    minibatch_loss_backward(models[1], plain, list(range(len(samples))), dataclasses.replace(cfg, opd_coef=0.0),
                            use_kl=False, use_opd=False, temperature=TEMPERATURE, token_budget=4096)
    for (name, a), (_, b) in zip(models[0].named_parameters(), models[1].named_parameters()):
        # the per-token loss runs in fp32: the shift added there or before rounds alike to ~1e-7
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-8, msg=name)
    assert "gate_mean" not in metrics
    assert metrics["opd_term"] == pytest.approx(
        float((LAMBDA * delta)[scores.teacher_mask].mean()), rel=1e-6)


@pytest.mark.parametrize("mode", losses.OPD_MODES)
def test_each_form_moves_fp32_weights_at_the_demo_lr(mode):
    """fp32 master weights at the demo recipe's lr 3e-4: one step of the teacher term alone moves them."""
    model = build_decoder(make_config("qwen3"), dtype=torch.float32, seed=2)
    samples = random_samples(torch.Generator().manual_seed(3), n=6)
    scores = score(model, samples, keep_teacher_hidden=True)
    batch = UpdateBatch(samples, torch.zeros(len(samples)), None, teacher_logprob=scores.teacher_logprob,
                        teacher_mask=scores.teacher_mask, teacher_hidden=scores.teacher_hidden)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    minibatch_loss_backward(model, batch, list(range(len(samples))),
                            LossConfig(opd_coef=0.3, opd_mode=mode, **PLAIN), use_kl=False, use_opd=True,
                            temperature=1.0, token_budget=4096)
    optimizer.step()
    moved = sum(int((p != q).sum()) for p, q in zip(model.parameters(), before))
    assert moved > 0.5 * sum(p.numel() for p in before)


def test_a_divergence_form_without_the_teachers_rows_is_one_error_naming_it():
    model = build_decoder(make_config("qwen3"), dtype=torch.float32, seed=2)
    samples = random_samples(torch.Generator().manual_seed(3), n=4)
    scores = score(model, samples)
    batch = UpdateBatch(samples, torch.zeros(len(samples)), None, teacher_logprob=scores.teacher_logprob,
                        teacher_mask=scores.teacher_mask)
    with pytest.raises(ValueError, match="opd_mode='reverse_kl' needs the teacher's hidden rows"):
        minibatch_loss_backward(model, batch, [0, 1, 2, 3], LossConfig(opd_mode="reverse_kl", **PLAIN),
                                use_kl=False, use_opd=True, temperature=1.0, token_budget=4096)
