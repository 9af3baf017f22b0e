"""vLLM engine (GPU + vllm): same greedy tokens and log-probs as the own sampler, weights synced in place."""

import pytest
import torch

from seedfast.model import DecoderConfig, build_decoder, save_hf
from seedfast.rollout.own_engine import Sampler
from seedfast.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("vllm")
    from seedfast.rollout.vllm_engine import VLLMEngine

    cfg = DecoderConfig(model_type="qwen3", vocab_size=512, hidden_size=256, intermediate_size=512,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                        tie_word_embeddings=False, max_position_embeddings=1024)
    model = build_decoder(cfg, dtype=torch.float32, device="cuda", attn_backend="sdpa", seed=0)
    with torch.no_grad():
        model.lm_head_weight.mul_(20.0)  # peaked next-token distributions: bf16 rounding cannot flip argmax
    folder = tmp_path_factory.mktemp("vllm_model")
    save_hf(model.to(torch.bfloat16), folder)
    model = model.to(torch.bfloat16)
    engine = VLLMEngine(str(folder), dtype="bf16", gpu_memory_utilization=0.2, max_model_len=512,
                        enforce_eager=True)
    return model, engine


def prompts():
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (5, 17, 40, 3)]


@pytest.mark.gpu
def test_greedy_tokens_and_logprobs_match_the_own_sampler(setup):
    model, engine = setup
    ours = Sampler(model).generate_full(prompts(), SamplingParams(8, temperature=0.0))
    theirs = engine.generate_full(prompts(), SamplingParams(8, temperature=0.0))
    for a, b in zip(ours, theirs):
        assert b.token_ids[:4] == a.token_ids[:4]
        assert b.logprobs is not None and len(b.logprobs) == len(b.token_ids)
        torch.testing.assert_close(torch.tensor(b.logprobs[:4]), torch.tensor(a.logprobs[:4]), atol=0.1, rtol=0)


@pytest.mark.gpu
def test_stop_ids_end_completions_and_are_kept(setup):
    _, engine = setup
    free = engine.generate(prompts(), SamplingParams(6, temperature=0.0))
    stop = free[0][1]
    for f, g in zip(free, engine.generate_full(prompts(), SamplingParams(6, temperature=0.0, stop_ids=[stop]))):
        cut = f.index(stop) + 1 if stop in f else len(f)
        assert g.token_ids == f[:cut]
        assert g.finish_reason == ("stop" if stop in f else "length")


@pytest.mark.gpu
def test_load_weights_updates_generation_in_place(setup):
    model, engine = setup
    before = engine.generate(prompts(), SamplingParams(4, temperature=0.0))
    with torch.no_grad():
        model.lm_head_weight.copy_(model.lm_head_weight[torch.randperm(512, generator=torch.Generator().manual_seed(1))
                                   .to(model.lm_head_weight.device)])
        model.model.norm.weight.mul_(1.5)
    engine.load_weights(model.state_dict())  # verifies a read-back checksum
    after = engine.generate(prompts(), SamplingParams(4, temperature=0.0))
    assert after != before
    ours = Sampler(model).generate(prompts(), SamplingParams(4, temperature=0.0))
    assert [a[:2] for a in after] == [o[:2] for o in ours]


def test_missing_vllm_gives_one_clear_error(monkeypatch):
    import builtins

    from seedfast.rollout.vllm_engine import VLLMEngine

    real_import = builtins.__import__

    def no_vllm(name, *args, **kwargs):
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError("No module named 'vllm'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_vllm)
    with pytest.raises(ImportError, match=r"pip install 'seedfast\[gpu\]'"):
        VLLMEngine("/nonexistent")
