"""A prompt repeated in a batch runs once (seedfast/scoring/shared_prompts.py): the same rows, log-probs and gradients
as one call over every P ⊕ A[:-1] (fp64), ℓref against transformers' own model, and the model sees each distinct
prompt once."""

import pytest
import torch

from seedfast.config import LossConfig
from seedfast.model import PackedKV, attention_shared_past, make_cu_seqlens
from seedfast.model.decoder import build_decoder
from seedfast.scoring import StepSample, score, score_reference, shared_prompts
from seedfast.scoring.packing import distinct_prefixes, pack, prompt_order
from seedfast.scoring.shared_prompts import response_rows, sharing_pays
from seedfast.train.update import UpdateBatch, minibatch_loss_backward
from tests.scoring.scoring_helpers import hf_twin, make_config, reference_scores, repeated_prompts


def test_distinct_prefixes_and_prompt_order_by_hand():
    s = [StepSample(prompt_ids=p, response_ids=[1]) for p in ([1, 2, 3], [1, 2, 4], [1, 2, 3], [5], [1, 2, 4])]
    assert distinct_prefixes(s, [2, 2, 2, 1, 2]) == ([0, 3], [0, 0, 0, 1, 0])  # P[:2] = [1, 2] for all but [5]
    assert distinct_prefixes(s, [3, 3, 3, 1, 3]) == ([0, 1, 3], [0, 1, 0, 2, 1])
    assert prompt_order(s, [4, 0, 1, 2, 3]) == [4, 1, 0, 2, 3]  # [1, 2, 4] first seen, then [1, 2, 3], then [5]


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])  # qwen2: tied head, qkv bias
def test_shared_rows_and_gradients_equal_the_single_call(family):
    model = build_decoder(make_config(family), dtype=torch.float64, seed=2)
    samples = repeated_prompts()
    runs = {}
    for share in (False, True):
        model.zero_grad(set_to_none=True)
        rows = response_rows(model, samples, share_prompts=share, return_kv=True)
        weights = torch.linspace(-1, 1, rows.hidden.numel(), dtype=torch.float64).view_as(rows.hidden)
        (rows.hidden * weights).sum().backward()
        runs[share] = rows, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    (single, single_grads), (shared, shared_grads) = runs[False], runs[True]
    torch.testing.assert_close(shared.hidden, single.hidden, rtol=1e-12, atol=1e-12)
    assert torch.equal(shared.targets, single.targets)
    assert shared_grads.keys() == single_grads.keys() and "model.embed_tokens.weight" in single_grads
    for name, grad in single_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, rtol=1e-10, atol=1e-12, msg=name)
    # the context KV a teacher branch reads: each sample's P[:-1] from position 0, in both ways
    for i, s in enumerate(samples):
        n = len(s.prompt_ids) - 1
        for layer in range(len(single.context_kv.keys)):
            k_single = single.context_kv.keys[layer][int(single.context_kv.cu_seqlens[i]):][:n]
            k_shared = shared.context_kv.keys[layer][int(shared.context_kv.cu_seqlens[i]):][:n]
            torch.testing.assert_close(k_shared, k_single, rtol=1e-12, atol=1e-12)


def _tokens_seen(model):
    seen = []
    model.register_forward_pre_hook(lambda _m, args: seen.append(int(args[0].numel())))
    return seen


def test_each_distinct_prompt_goes_through_the_model_once():
    model = build_decoder(make_config("qwen3"), dtype=torch.float32, seed=2)
    samples = repeated_prompts()
    seen = _tokens_seen(model)
    response_rows(model, samples, share_prompts=True)
    distinct = {tuple(s.prompt_ids.tolist()) for s in samples}
    assert seen == [sum(len(p) - 1 for p in distinct), sum(len(s.response_ids) for s in samples)]
    seen.clear()
    response_rows(model, samples, share_prompts=False)
    assert seen == [sum(len(s.prompt_ids) + len(s.response_ids) - 1 for s in samples)]
    seen.clear()
    response_rows(model, samples[:4] + samples[6:7], share_prompts=True)  # a, b, a, c, d: a repeats
    assert len(seen) == 2
    seen.clear()
    response_rows(model, [samples[i] for i in (0, 1, 3)], share_prompts=True)  # nothing repeats: one call
    assert len(seen) == 1


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_reference_scores_of_repeated_prompts_match_transformers(family):
    model = build_decoder(make_config(family), dtype=torch.float32, seed=4)
    hf = hf_twin(model)
    samples = repeated_prompts(seed=8)
    seen = _tokens_seen(model)
    scores = score_reference(model, samples, temperature=0.7)
    assert sum(seen) < sum(len(s.prompt_ids) + len(s.response_ids) - 1 for s in samples)  # the repeats ran once
    for i, s in enumerate(samples):
        expected, _ = reference_scores(hf, s.prompt_ids, s.response_ids, temperature=0.7)
        got = scores.logprob[scores.offsets[i]:scores.offsets[i + 1]]
        torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("in_place", [False, True])
def test_scoring_repeated_prefixes_runs_them_once_and_scores_as_each_alone(in_place, monkeypatch):
    model = build_decoder(make_config("qwen3"), dtype=torch.float32, seed=6)
    samples = repeated_prompts(seed=9)
    # the branches read their prefixes in place (attention_shared_past.py) or from copies (the varlen kernel)
    monkeypatch.setattr(shared_prompts, "sharing_pays", lambda *args: in_place)
    together = score(model, samples, with_entropy=True, temperature=1.1)
    monkeypatch.undo()
    for i, s in enumerate(samples):
        alone = score(model, [s], with_entropy=True, temperature=1.1)
        part = slice(int(together.offsets[i]), int(together.offsets[i + 1]))
        torch.testing.assert_close(together.logprob[part], alone.logprob, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(together.entropy[part], alone.entropy, rtol=1e-5, atol=1e-6)
        assert torch.equal(together.teacher_mask[part], alone.teacher_mask)
        torch.testing.assert_close(together.teacher_logprob[part], alone.teacher_logprob, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("teacher_from_forward", [False, True])
def test_the_update_with_shared_prompts_equals_one_sample_per_micro_batch(teacher_from_forward):
    """The update's micro-batches share a repeated prompt; with a budget that fits one sample each, nothing is
    shared: the loss, metrics and gradients agree."""
    model = build_decoder(make_config("qwen3"), dtype=torch.float64, seed=3)
    samples = repeated_prompts(seed=11)
    advantages = torch.linspace(-1.0, 1.0, len(samples), dtype=torch.float64)
    loss_cfg = LossConfig(opd_coef=0.5, opd_beta=2.0, kl_coef=0.0, entropy_coef=0.0)
    if teacher_from_forward:
        batch = UpdateBatch(samples, advantages, None, teacher_from_forward=True)
    else:
        scored = score(model, samples, temperature=1.0)
        batch = UpdateBatch(samples, advantages, scored.logprob.double() - 0.05, teacher_logprob=scored.teacher_logprob,
                            teacher_mask=scored.teacher_mask)
    widest = max(len(s.prompt_ids) + len(s.response_ids) - 1 for s in samples)
    out = {}
    for budget in (4096, widest):
        model.zero_grad(set_to_none=True)
        seen = _tokens_seen(model)
        loss, metrics = minibatch_loss_backward(model, batch, list(range(len(samples))), loss_cfg, use_kl=False,
                                                use_opd=True, temperature=1.0, token_budget=budget)
        model._forward_pre_hooks.clear()
        out[budget] = loss, metrics, {n: p.grad.clone() for n, p in model.named_parameters()}, sum(seen)
    (loss_a, metrics_a, grads_a, tokens_a), (loss_b, metrics_b, grads_b, tokens_b) = out[4096], out[widest]
    assert tokens_a < tokens_b  # shared: fewer tokens through the model
    # the loss ops compute in fp32 whatever the model's dtype, and the micro-batches sum in another order
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    assert metrics_a["opd_term"] != 0.0
    for key, value in metrics_b.items():
        assert metrics_a[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    for name, grad in grads_b.items():
        torch.testing.assert_close(grads_a[name], grad, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("fused", [True, False])
def test_a_shared_past_is_read_in_place_where_it_pays(monkeypatch, fused):
    """Fused (CPU): always. Unfused (the scores of a sequence's own part in memory): only where the sequences are the
    shorter part."""
    monkeypatch.setattr(shared_prompts, "shared_past_fused", lambda device, dtype: fused)

    def kv(lengths):
        cu = make_cu_seqlens(lengths)
        keys = [torch.zeros(int(cu[-1]), 1, 2)]
        return PackedKV(keys, [k.clone() for k in keys], cu)

    responses = pack([torch.zeros(24, dtype=torch.long)] * 3, [600] * 3, [torch.zeros(24, dtype=torch.long)] * 3)
    assert sharing_pays(responses, kv([600, 500]), [0, 0, 1])  # responses after long prompts: in place
    tails = pack([torch.zeros(1500, dtype=torch.long)] * 2, [96] * 2, [torch.zeros(128, dtype=torch.long)] * 2)
    assert sharing_pays(tails, kv([96]), [0, 0]) == fused  # long prompt tails after a short prefix: varlen if unfused


def test_fused_where_the_cpu_kernel_runs():
    assert attention_shared_past.fused(torch.device("cpu"), torch.float32)
    assert attention_shared_past.fused(torch.device("cpu"), torch.bfloat16)  # computed in fp32
    assert not attention_shared_past.fused(torch.device("meta"), torch.float32)
