"""The prefix-KV teacher: the teacher branch scored with θ from the update forward's own prefix KV."""

import pytest
import torch
from scoring_helpers import hf_twin, make_config, random_samples, reference_scores

from seedfast.model.decoder import build_decoder
from seedfast.scoring import shared_prefix_length, teacher_logprob_with_prefix
from seedfast.scoring.packing import pack_prefixes, pack_single


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
