"""The teacher's final hidden rows (score(keep_teacher_hidden=True), teacher_logprob_with_prefix(return_hidden=True)):
the rows times W give the teacher log-probs the scorer returns (fp64 log_softmax of rows @ Wᵀ / T at the targets),
they equal transformers' own model's last hidden state over the teacher context, and are zeros without a teacher."""

import pytest
import torch

from seedfast.context import StepSample
from seedfast.model.decoder import build_decoder
from seedfast.scoring import score, shared_prefix_length, teacher_logprob_with_prefix
from seedfast.scoring.packing import pack_prefixes, pack_single
from tests.scoring.scoring_helpers import hf_twin, make_config, random_samples, repeated_prompts

_MODELS: dict[str, tuple] = {}


def models_for(family: str) -> tuple:
    if family not in _MODELS:
        model = build_decoder(make_config(family), dtype=torch.float32, seed=4)
        _MODELS[family] = (model, hf_twin(model))
    return _MODELS[family]


def targets(samples) -> torch.Tensor:
    return torch.cat([s.response_ids for s in samples])


def logprob_from_rows(rows: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, temperature: float):
    """The fp64 reference: log_softmax(rows @ Wᵀ / T) at the target ids, logits materialized."""
    logits = rows.double() @ weight.double().T / temperature
    return torch.log_softmax(logits, -1).gather(1, target[:, None])[:, 0]


def check_rows(model, samples, teacher_hidden, teacher_logprob, teacher_mask, temperature):
    n = sum(len(s.response_ids) for s in samples)
    assert teacher_hidden.shape == (n, model.config.hidden_size)
    assert teacher_hidden.dtype == model.lm_head_weight.dtype and not teacher_hidden.requires_grad
    assert teacher_mask.tolist() == [s.has_teacher for s in samples for _ in s.response_ids]
    assert bool((teacher_hidden[~teacher_mask] == 0).all())
    expected = logprob_from_rows(teacher_hidden[teacher_mask], model.lm_head_weight, targets(samples)[teacher_mask],
                                 temperature)
    torch.testing.assert_close(teacher_logprob[teacher_mask].double(), expected, rtol=0, atol=2e-5)


@torch.no_grad()
def check_against_hf(hf, samples, teacher_hidden):
    """Each teacher row equals transformers' last hidden state (after the final norm) at the row of the teacher
    context P[:k] ⊕ S ⊕ P[k:] ⊕ A[:-1] that predicts that response token."""
    offset = 0
    for sample in samples:
        n = len(sample.response_ids)
        if sample.has_teacher:
            context = sample.teacher_prompt_ids()
            ids = torch.cat([context, sample.response_ids[:-1]])[None]
            expected = hf.model(ids).last_hidden_state[0, len(context) - 1:]
            torch.testing.assert_close(teacher_hidden[offset:offset + n], expected, rtol=0, atol=1e-5)
        offset += n


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("token_budget", [10_000, 60])  # one micro-batch, and several put back in sample order
def test_score_keeps_the_rows_of_the_teacher_log_probs(family, token_budget):
    model, hf = models_for(family)
    samples = random_samples(torch.Generator().manual_seed(8), n=12)  # some without a teacher (failed skill)
    assert not all(s.has_teacher for s in samples)
    out = score(model, samples, token_budget=token_budget, temperature=1.3, keep_teacher_hidden=True)
    check_rows(model, samples, out.teacher_hidden, out.teacher_logprob, out.teacher_mask, 1.3)
    check_against_hf(hf, samples, out.teacher_hidden)
    plain = score(model, samples, token_budget=token_budget, temperature=1.3)
    assert plain.teacher_hidden is None
    for name in ("logprob", "teacher_logprob", "teacher_mask"):  # asking for the rows changes nothing else
        assert torch.equal(getattr(out, name), getattr(plain, name)), name


def test_score_keeps_the_rows_with_repeated_prompts_and_every_sample_taught():
    """Repeated prompts (their prefix runs once, the branches read it where it is held), and a batch where every
    sample has a teacher (its teacher rows are taken in one piece)."""
    model, hf = models_for("qwen3")
    samples = repeated_prompts(seed=3)
    out = score(model, samples, temperature=0.7, keep_teacher_hidden=True)
    check_rows(model, samples, out.teacher_hidden, out.teacher_logprob, out.teacher_mask, 0.7)
    check_against_hf(hf, samples, out.teacher_hidden)
    taught = [s for s in samples if s.has_teacher]
    out = score(model, taught, temperature=0.7, keep_teacher_hidden=True)
    check_rows(model, taught, out.teacher_hidden, out.teacher_logprob, out.teacher_mask, 0.7)


def test_score_keeps_no_rows_for_no_samples_or_no_teacher():
    model, _ = models_for("llama")
    out = score(model, [], keep_teacher_hidden=True)
    assert out.teacher_hidden.shape == (0, model.config.hidden_size)
    untaught = [StepSample(prompt_ids=[1, 2, 3], response_ids=[4, 5]), StepSample(prompt_ids=[6], response_ids=[7])]
    out = score(model, untaught, keep_teacher_hidden=True)
    assert out.teacher_hidden.shape == (3, model.config.hidden_size) and not bool(out.teacher_hidden.any())


def prefix_kv(model, samples, source: str):
    with torch.no_grad():
        if source == "update_forward":  # what the trainer has: the update's forward over P ⊕ A[:-1]
            packed = pack_single(samples)
        else:
            packed = pack_prefixes(samples, [shared_prefix_length(s) for s in samples])
        return model(packed.input_ids, packed.cu_seqlens, return_kv=True)[1]


@pytest.mark.parametrize("kv_source", ["update_forward", "prefix_only"])
def test_prefix_kv_teacher_returns_the_rows_of_its_log_probs(kv_source):
    model, hf = models_for("qwen2")
    samples = random_samples(torch.Generator().manual_seed(9), n=12)
    kv = prefix_kv(model, samples, kv_source)
    teacher, mask, hidden = teacher_logprob_with_prefix(model, kv, samples, temperature=1.3, return_hidden=True)
    check_rows(model, samples, hidden, teacher, mask, 1.3)
    check_against_hf(hf, samples, hidden)
    plain_teacher, plain_mask = teacher_logprob_with_prefix(model, kv, samples, temperature=1.3)
    assert torch.equal(plain_teacher, teacher) and torch.equal(plain_mask, mask)


def test_prefix_kv_teacher_rows_with_a_repeated_teacher_context():
    """Teacher contexts that several samples hold run once (the distinct-context path), some samples untaught."""
    model, hf = models_for("llama")
    samples = repeated_prompts(seed=4)
    kv = prefix_kv(model, samples, "update_forward")
    teacher, mask, hidden = teacher_logprob_with_prefix(model, kv, samples, temperature=0.7, return_hidden=True)
    check_rows(model, samples, hidden, teacher, mask, 0.7)
    check_against_hf(hf, samples, hidden)
    taught = [s for s in samples if s.has_teacher]  # every sample taught: the rows come back as they are
    kv = prefix_kv(model, taught, "update_forward")
    teacher, mask, hidden = teacher_logprob_with_prefix(model, kv, taught, temperature=0.7, return_hidden=True)
    check_rows(model, taught, hidden, teacher, mask, 0.7)


def test_prefix_kv_teacher_rows_without_any_teacher_are_zeros():
    model, _ = models_for("llama")
    untaught = [StepSample(prompt_ids=[1, 2, 3], response_ids=[4, 5]), StepSample(prompt_ids=[6], response_ids=[7])]
    teacher, mask, hidden = teacher_logprob_with_prefix(model, prefix_kv(model, untaught, "update_forward"), untaught,
                                                        return_hidden=True)
    assert hidden.shape == (3, model.config.hidden_size) and not bool(hidden.any()) and not bool(mask.any())
