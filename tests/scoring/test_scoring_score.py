"""The shared-prefix scorer against full forwards of transformers' own models with materialized log_softmax."""

import pytest
import torch

from seedfast.model import attention_shared_past
from seedfast.model.decoder import build_decoder
from seedfast.scoring import StepSample, score, score_reference
from tests.scoring.scoring_helpers import VOCAB, hf_twin, make_config, random_samples, reference_scores

_MODELS: dict[str, tuple] = {}


def models_for(family: str) -> tuple:
    if family not in _MODELS:
        model = build_decoder(make_config(family), dtype=torch.float32, seed=3)
        _MODELS[family] = (model, hf_twin(model))
    return _MODELS[family]


@pytest.fixture(params=["llama", "qwen2", "qwen3"])
def models(request):
    return models_for(request.param)


# flex runs eagerly on CPU (slow): one family there, every family with sdpa
@pytest.mark.parametrize("family, attn_backend",
                         [("llama", "sdpa"), ("qwen2", "sdpa"), ("qwen3", "sdpa"), ("qwen3", "flex")])
def test_dual_context_matches_two_full_forwards(family, attn_backend):
    model, hf = models_for(family)
    samples = random_samples(torch.Generator().manual_seed(7))
    out = score(model, samples, with_entropy=True, token_budget=80, attn_backend=attn_backend)
    assert len(out) == len(samples)
    for sample, result in zip(samples, out):
        logprob, entropy = reference_scores(hf, sample.prompt_ids, sample.response_ids)
        torch.testing.assert_close(result.logprob.double(), logprob, atol=1e-4, rtol=0)
        torch.testing.assert_close(result.entropy.double(), entropy, atol=1e-4, rtol=0)
        if sample.has_teacher:
            teacher, _ = reference_scores(hf, sample.teacher_prompt_ids(), sample.response_ids)
            torch.testing.assert_close(result.teacher_logprob.double(), teacher, atol=1e-4, rtol=0)
        else:
            assert result.teacher_logprob is None
    assert out.teacher_mask.tolist() == [s.has_teacher for s in samples for _ in s.response_ids]
    assert bool((out.teacher_logprob[~out.teacher_mask] == 0).all())


def test_budget_does_not_change_results():
    model, _ = models_for("qwen3")
    samples = random_samples(torch.Generator().manual_seed(11), n=8)
    one_batch = score(model, samples, token_budget=10_000)
    many = score(model, samples, token_budget=50)
    torch.testing.assert_close(many.logprob, one_batch.logprob, atol=1e-5, rtol=0)
    torch.testing.assert_close(many.teacher_logprob, one_batch.teacher_logprob, atol=1e-5, rtol=0)


def test_reference_scoring_and_temperature(models):
    model, hf = models
    samples = random_samples(torch.Generator().manual_seed(5), n=6)
    out = score_reference(model, samples, token_budget=40, temperature=0.7)
    assert out.teacher_logprob is None and out.entropy is None
    for sample, result in zip(samples, out):
        expected, _ = reference_scores(hf, sample.prompt_ids, sample.response_ids, temperature=0.7)
        torch.testing.assert_close(result.logprob.double(), expected, atol=1e-4, rtol=0)


def test_late_insertion_spends_few_tokens_on_the_teacher():
    """The teacher branch holds only S ⊕ P[k:] ⊕ A[:-1]: count the tokens each model call receives."""
    model = build_decoder(make_config("llama"), dtype=torch.float32)
    calls = []
    original = model.forward

    def counting(input_ids, cu_seqlens, **kw):
        calls.append((input_ids.numel(), kw.get("past") is not None))
        return original(input_ids, cu_seqlens, **kw)

    model.forward = counting
    prompt, response = torch.arange(40) % VOCAB, torch.arange(5)
    sample = StepSample(prompt_ids=prompt, response_ids=response, insert_at=37, privileged_ids=[1, 2, 3])
    score(model, [sample])
    # prefix P[:37]; branches: student P[37:] ⊕ A[:-1] = 3 + 4, teacher S ⊕ P[37:] ⊕ A[:-1] = 3 + 3 + 4
    assert calls == [(37, False), (17, True)]


def test_empty_batch():
    model = build_decoder(make_config("llama"), dtype=torch.float32)
    out = score(model, [])
    assert len(out) == 0 and out.logprob.numel() == 0


def test_bad_input_is_named():
    model = build_decoder(make_config("llama"), dtype=torch.float32)
    long = StepSample(prompt_ids=list(range(50)), response_ids=[1, 2], insert_at=3, privileged_ids=[4],
                      sample_id="traj2/step9")
    fine = StepSample(prompt_ids=[1, 2], response_ids=[3])
    with pytest.raises(ValueError, match="sample 'traj2/step9' needs .* token_budget=20"):
        score(model, [fine, long], token_budget=20)
    with pytest.raises(ValueError, match=r"samples\[0\] needs 51 tokens .* token_budget=20"):
        score_reference(model, [StepSample(prompt_ids=list(range(50)), response_ids=[1, 2])], token_budget=20)
    with pytest.raises(TypeError, match=r"samples\[1\] must be a StepSample"):
        score(model, [fine, {"prompt_ids": [1]}])
    with pytest.raises(TypeError, match="samples must be a sequence"):
        score(model, fine)
    for bad in (0.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="temperature must be finite and > 0"):
            score(model, [fine], temperature=bad)
    with pytest.raises(ValueError, match="input_ids must lie in"):
        score(model, [StepSample(prompt_ids=[VOCAB + 5, 1], response_ids=[1])])


def test_the_unfused_shared_past_attention_scores_alike(monkeypatch):
    """Off the CPU kernel (model/attention_shared_past.py: the scores in memory, as on GPU) the scores agree, with the
    branches reading their prefixes in place wherever they are the shorter part."""
    model, _ = models_for("qwen3")
    samples = random_samples(torch.Generator().manual_seed(12), n=10)
    fused = score(model, samples, with_entropy=True, temperature=0.9)
    monkeypatch.setattr(attention_shared_past, "_FLASH_CPU", None)
    unfused = score(model, samples, with_entropy=True, temperature=0.9)
    for name in ("logprob", "teacher_logprob", "entropy"):
        torch.testing.assert_close(getattr(unfused, name), getattr(fused, name), rtol=0, atol=1e-5)
