"""The prefix-KV teacher: the teacher branch scored with θ from the update forward's own prefix KV."""

import pytest
import torch

from seedfast.context import StepSample
from seedfast.model.decoder import build_decoder
from seedfast.scoring import shared_prefix_length, teacher_logprob_with_prefix
from seedfast.scoring.packing import pack_prefixes, pack_single
from tests.scoring.scoring_helpers import hf_twin, make_config, random_samples, reference_scores


@pytest.fixture(scope="module")
def model():
    return build_decoder(make_config("qwen3"), dtype=torch.float32, seed=5)


@pytest.mark.parametrize("kv_source", ["update_forward", "prefix_only"])
def test_matches_full_forward_of_the_teacher_context(model, kv_source):
    samples = random_samples(torch.Generator().manual_seed(2), n=8)
    if kv_source == "update_forward":  # what the trainer has: a forward over P ⊕ A[:-1] with grad
        packed = pack_single(samples)
        hidden, kv = model(packed.input_ids, packed.cu_seqlens, return_kv=True)
        assert hidden.requires_grad
    else:
        with torch.no_grad():
            packed = pack_prefixes(samples, [shared_prefix_length(s) for s in samples])
            _, kv = model(packed.input_ids, packed.cu_seqlens, return_kv=True)
    teacher, mask = teacher_logprob_with_prefix(model, kv, samples, temperature=1.3)
    assert not teacher.requires_grad
    hf = hf_twin(model)
    offset = 0
    for sample in samples:
        n = len(sample.response_ids)
        assert bool(mask[offset:offset + n].all()) == sample.has_teacher
        if sample.has_teacher:
            expected, _ = reference_scores(hf, sample.teacher_prompt_ids(), sample.response_ids, temperature=1.3)
            torch.testing.assert_close(teacher[offset:offset + n].double(), expected, atol=1e-4, rtol=0)
        else:
            assert bool((teacher[offset:offset + n] == 0).all())
        offset += n
    assert offset == teacher.numel()


def test_a_repeated_teacher_context_runs_once_and_scores_each_response(model, monkeypatch):
    """Samples sharing a prompt and a skill (an oracle's one skill per game and outcome, a group at a shared prompt)
    differ only in their response: the context runs once and each response is scored against its KV, giving the
    HF reference's log-probs for every sample."""
    base = [s for s in random_samples(torch.Generator().manual_seed(6), n=12) if s.has_teacher][:4]
    gen = torch.Generator().manual_seed(7)
    samples = [StepSample(prompt_ids=s.prompt_ids, insertions=s.insertions, teacher_drops=s.teacher_drops,
                          response_ids=torch.randint(0, model.config.vocab_size, (r,), generator=gen), sample_id=(k, r))
               for k, s in enumerate(base) for r in (1, 3, 4)]  # each context three times
    calls = []
    forward = type(model).forward
    monkeypatch.setattr(type(model), "forward", lambda self, ids, cu, *a, **kw: calls.append(
        (int(cu.numel()) - 1, kw.get("past_owner") is not None)) or forward(self, ids, cu, *a, **kw))
    with torch.no_grad():
        packed = pack_single(samples)
        _, kv = forward(model, packed.input_ids, packed.cu_seqlens, return_kv=True)
    teacher, mask = teacher_logprob_with_prefix(model, kv, samples)
    # the distinct contexts, then one branch per sample reading its context's keys and values where they are held
    assert calls == [(len(base), False), (len(samples), True)]
    assert bool(mask.all())
    hf, offset = hf_twin(model), 0
    for sample in samples:
        n = len(sample.response_ids)
        expected, _ = reference_scores(hf, sample.teacher_prompt_ids(), sample.response_ids)
        torch.testing.assert_close(teacher[offset:offset + n].double(), expected, atol=1e-4, rtol=0)
        offset += n


def test_kv_that_does_not_fit_the_samples(model):
    samples = random_samples(torch.Generator().manual_seed(4), n=3)
    with torch.no_grad():
        packed = pack_single(samples[:2])
        _, kv = model(packed.input_ids, packed.cu_seqlens, return_kv=True)
        with pytest.raises(ValueError, match="holds 2 sequences for 3 samples"):
            teacher_logprob_with_prefix(model, kv, samples)
        short = pack_prefixes(samples, [0] * len(samples))
        _, kv = model(short.input_ids, short.cu_seqlens, return_kv=True)
        needy = next(i for i, s in enumerate(samples) if s.has_teacher and shared_prefix_length(s) > 0)
        with pytest.raises(ValueError, match=f"sample {needy}: prefix_kv sequence {needy} has 0 tokens"):
            teacher_logprob_with_prefix(model, kv, samples)
    with pytest.raises(TypeError, match="prefix_kv must be a PackedKV"):
        teacher_logprob_with_prefix(model, None, samples)
