"""The scorer on CUDA: every attention backend there (flash needs the flash-attn package and bf16/fp16)."""

import pytest
import torch

from seedfast.model.attention_flash import usable as flash_usable
from seedfast.model.decoder import build_decoder
from seedfast.scoring import score, score_reference
from tests.scoring.scoring_helpers import hf_twin, make_config, random_samples, reference_scores

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def check(out, samples, hf, atol):
    for sample, result in zip(samples, out):
        logprob, _ = reference_scores(hf, sample.prompt_ids, sample.response_ids)
        torch.testing.assert_close(result.logprob.double().cpu(), logprob, atol=atol, rtol=0)
        if sample.has_teacher:
            teacher, _ = reference_scores(hf, sample.teacher_prompt_ids(), sample.response_ids)
            torch.testing.assert_close(result.teacher_logprob.double().cpu(), teacher, atol=atol, rtol=0)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("attn_backend", ["sdpa", "flex"])
def test_fp32_on_cuda(family, attn_backend):
    model = build_decoder(make_config(family), dtype=torch.float32, seed=1)
    hf = hf_twin(model)
    samples = random_samples(torch.Generator().manual_seed(9), n=12)
    out = score(model.cuda(), samples, token_budget=120, attn_backend=attn_backend)
    check(out, samples, hf, atol=1e-4)


@pytest.mark.parametrize("attn_backend", ["auto", "sdpa", "flex", "flash"])
def test_bf16_on_cuda(attn_backend):
    if attn_backend == "flash" and not flash_usable(torch.device("cuda"), torch.bfloat16):
        pytest.skip("flash-attn is not installed")
    model = build_decoder(make_config("qwen2"), dtype=torch.float32, seed=1)
    hf = hf_twin(model)
    samples = random_samples(torch.Generator().manual_seed(9), n=12)
    model = model.to(device="cuda", dtype=torch.bfloat16)
    out = score(model, samples, token_budget=120, attn_backend=attn_backend)
    check(out, samples, hf, atol=5e-2)  # bf16 weights and activations against the fp32 model
    single = score_reference(model, samples, token_budget=120, attn_backend=attn_backend)
    torch.testing.assert_close(out.logprob, single.logprob, atol=5e-2, rtol=0)
