"""skill.teacher_params: current (the paper's text: π_θ scores both contexts): in every optimizer step of an
off-policy update (2 epochs × 2 mini-batches) ℓskill is the current θ's, equal to a from-scratch fp64 forward of
the spliced teacher context by transformers' own model under the same weights."""


import pytest
import torch
import transformers

import seedfast.train.update as update
from seedfast.config import LossConfig, load_config
from seedfast.model.decoder import build_decoder
from seedfast.scoring import score
from seedfast.train.step_plan import plan_step
from seedfast.train.update import UpdateBatch, minibatch_loss_backward
from tests.scoring.scoring_helpers import make_config, random_samples, reference_scores

TEMPERATURE = 1.3


def fp64_twin(model) -> torch.nn.Module:
    """transformers' own model of the family, in fp64, holding `model`'s weights as they are now."""
    config = transformers.AutoConfig.for_model(**model.config.to_hf_dict())
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").double().eval()
    result = hf.load_state_dict(model.state_dict(), strict=False)
    assert not result.missing_keys and not result.unexpected_keys
    return hf


def test_current_teacher_is_scored_in_the_update_even_off_policy():
    base = ["algorithm=seed", "trainer.ppo_epochs=2", "trainer.mini_batches=2"]
    assert plan_step(load_config(None, [*base, "skill.teacher_params=current"])).teacher == "update"
    assert plan_step(load_config(None, [*base, "skill.teacher_params=old"])).teacher == "scorer"


def test_every_optimizer_step_scores_the_teacher_with_the_current_parameters(monkeypatch):
    model = build_decoder(make_config("llama"), dtype=torch.float64, seed=4)
    samples = random_samples(torch.Generator().manual_seed(11), n=10)
    advantages = torch.linspace(-1.0, 1.0, len(samples), dtype=torch.float64)
    old = score(model, samples, temperature=TEMPERATURE).logprob  # θ_old, as the scoring pass gives it
    batch = UpdateBatch(samples, advantages, old, teacher_from_forward=True)
    loss_cfg = LossConfig(opd_coef=0.5, opd_beta=3.0, entropy_coef=0.0, kl_coef=0.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2)

    checked: list[tuple[int, float]] = []  # (sample id, ℓskill of its first response token) per look
    real = update.teacher_logprob_with_prefix

    def checking(model_, kv, micro_samples, **kwargs):
        teacher, mask = real(model_, kv, micro_samples, **kwargs)
        hf = fp64_twin(model_)  # the weights at this moment: the step's current θ
        offset = 0
        for s in micro_samples:
            n = len(s.response_ids)
            if s.has_teacher:
                expected, _ = reference_scores(hf, s.teacher_prompt_ids(), torch.as_tensor(s.response_ids),
                                               TEMPERATURE)
                # computed in fp64, returned as fp32 log-probs: equal to fp32 rounding
                torch.testing.assert_close(teacher[offset:offset + n].detach().double(), expected, rtol=0, atol=2e-6)
                assert bool(mask[offset:offset + n].all())
                checked.append((s.sample_id, float(expected[0])))
            else:
                assert not bool(mask[offset:offset + n].any())
            offset += n
        return teacher, mask

    monkeypatch.setattr(update, "teacher_logprob_with_prefix", checking)
    halves = [list(range(0, 10, 2)), list(range(1, 10, 2))]
    for _epoch in range(2):
        for index in halves:
            optimizer.zero_grad(set_to_none=True)
            minibatch_loss_backward(model, batch, index, loss_cfg, use_kl=False, use_opd=True,
                                    temperature=TEMPERATURE, token_budget=4096)
            optimizer.step()

    with_teacher = [s.sample_id for s in samples if s.has_teacher]
    assert sorted(i for i, _ in checked) == sorted(with_teacher * 2)  # each teacher sample, once per epoch
    # the teacher moved with θ: a sample's ℓskill in epoch 2 is not its epoch-1 value (θ_old's)
    first = {i: v for i, v in checked[:len(with_teacher)]}
    second = {i: v for i, v in checked[len(with_teacher):]}
    assert all(abs(second[i] - first[i]) > 1e-6 for i in with_teacher)


@pytest.mark.parametrize("teacher_params", ["old", "current"])
def test_weights_move_at_the_demo_lr_with_either_teacher(teacher_params):
    """fp32 master weights, the demo recipe's lr 3e-4: one step moves them (an update that rounds away is silent)."""
    model = build_decoder(make_config("qwen3"), dtype=torch.float32, seed=2)
    samples = random_samples(torch.Generator().manual_seed(3), n=6)
    scores = score(model, samples)
    advantages = torch.zeros(len(samples))  # the OPD term alone
    batch = (UpdateBatch(samples, advantages, None, teacher_from_forward=True) if teacher_params == "current" else
             UpdateBatch(samples, advantages, None, teacher_logprob=scores.teacher_logprob,
                         teacher_mask=scores.teacher_mask))
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    minibatch_loss_backward(model, batch, list(range(len(samples))), LossConfig(opd_coef=0.3, kl_coef=0.0),
                            use_kl=False, use_opd=True, temperature=1.0, token_budget=4096)
    optimizer.step()
    moved = sum(int((p != q).sum()) for p, q in zip(model.parameters(), before))
    assert moved > 0.5 * sum(p.numel() for p in before)
