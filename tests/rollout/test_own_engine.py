"""The KV-cache sampler against full re-forwards with materialized logits (the independent reference)."""

import pytest
import torch

from seedfast.model import DecoderConfig, build_decoder, make_cu_seqlens
from seedfast.model.kv import StaticKVCache
from seedfast.rollout.own_engine import Sampler
from seedfast.sampling_params import SamplingParams

VOCAB = 300


def tiny(model_type="qwen3", tie=True, seed=0, kv_heads=2):
    cfg = DecoderConfig(model_type=model_type, vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=kv_heads,
                        tie_word_embeddings=tie)
    model = build_decoder(cfg, dtype=torch.float32, attn_backend="sdpa", seed=seed)
    with torch.no_grad():  # a peaked next-token distribution, so greedy choices are not near-ties
        model.lm_head_weight.mul_(8.0)
    return model


@pytest.fixture(scope="module")
def model():
    return tiny()


def random_prompts(n, low=1, high=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high, (n,), generator=gen).tolist()
    return [torch.randint(0, VOCAB, (length,), generator=gen).tolist() for length in lengths]


def last_logits(model, seqs):
    """Reference: full forward of every sequence, logits of its last position in fp64."""
    ids = torch.tensor([t for s in seqs for t in s])
    cu = make_cu_seqlens([len(s) for s in seqs])
    with torch.no_grad():
        hidden = model(ids, cu)[cu[1:].long() - 1]
    return hidden.double() @ model.lm_head_weight.double().T


def reference_greedy(model, prompts, max_new, stop_ids):
    outs = [[] for _ in prompts]
    live = list(range(len(prompts)))
    for _ in range(max_new):
        if not live:
            break
        logits = last_logits(model, [prompts[b] + outs[b] for b in live])
        for b, token in zip(live, logits.argmax(-1).tolist()):
            outs[b].append(token)
        live = [b for b in live if outs[b][-1] not in stop_ids]
    return outs


@pytest.mark.parametrize("model_type, tie, kv_heads", [("qwen3", False, 2), ("llama", True, 1), ("qwen2", True, 4)])
def test_sampled_logprobs_equal_the_full_forward_at_every_position(model_type, tie, kv_heads):
    """The cache changes nothing: at each generated position the sampler's log-prob equals the full no-cache
    forward's, and the ids equal the no-cache sampler's (ragged prompts, a repeated prompt, early stops)."""
    model = tiny(model_type, tie, seed=2, kv_heads=kv_heads)
    prompts = random_prompts(5, seed=12) + [[4]]
    prompts += prompts[:2]
    temperature = 1.3
    params = SamplingParams(8, temperature=temperature, stop_ids=[5, 17, 60])
    gens = Sampler(model, seed=13).generate_full(prompts, params)
    uncached = Sampler(model, seed=13, use_cache=False).generate_full(prompts, params)
    assert [g.token_ids for g in gens] == [g.token_ids for g in uncached]
    for prompt, gen in zip(prompts, gens):
        logits = full_logits(model, prompt + gen.token_ids)[len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits / temperature, -1).gather(1, torch.tensor(gen.token_ids)[:, None])
        torch.testing.assert_close(torch.tensor(gen.logprobs, dtype=torch.float64), expected[:, 0],
                                   rtol=0, atol=1e-5)


def full_logits(model, seq):
    """Logits [len(seq), V] in fp64 at every position of one sequence, from the forward without a cache."""
    with torch.no_grad():
        hidden = model(torch.tensor(seq), make_cu_seqlens([len(seq)]))
    return hidden.double() @ model.lm_head_weight.double().T


def test_kv_cache_select_keeps_rows_and_rejects_overflow(model):
    prompts = [[1, 2, 3], [4, 5]]
    with torch.no_grad():
        _, kv = model(torch.tensor([1, 2, 3, 4, 5]), make_cu_seqlens([3, 2]), return_kv=True)
        cache = StaticKVCache.from_packed(kv, capacity=4)
        one = cache.select(torch.tensor([1]))
        assert one.lengths.tolist() == [2]
        torch.testing.assert_close(one.keys[0][0, :, :2], kv.keys[0][3:5].transpose(0, 1))
        model.decode(torch.tensor([9, 9]), cache)  # row 0 is now full
        assert cache.lengths.tolist() == [4, 3]
        with pytest.raises(ValueError, match="KV cache is full"):
            model.decode(torch.tensor([9, 9]), cache)
        with pytest.raises(ValueError, match="capacity"):
            StaticKVCache.from_packed(kv, capacity=len(prompts[0]) - 1)


def test_greedy_with_cache_equals_without_cache_and_reference(model):
    prompts = random_prompts(9, seed=2) + [[3]]
    stop_ids = [11, 42, 97, 150, 222]  # some sequences stop early, so finished rows get dropped mid-batch
    cached = Sampler(model).generate(prompts, SamplingParams(12, temperature=0.0, stop_ids=stop_ids))
    uncached = Sampler(model, use_cache=False).generate(prompts, SamplingParams(12, temperature=0.0, stop_ids=stop_ids))
    expected = reference_greedy(model, prompts, 12, stop_ids)
    assert cached == expected
    assert uncached == expected
    lengths = {len(o) for o in cached}
    assert len(lengths) > 1, "the stop ids should end sequences at different steps"


def test_finish_reason_and_stop_token_kept(model):
    prompts = random_prompts(6, seed=3)
    free = Sampler(model).generate_full(prompts, SamplingParams(5, temperature=0.0))
    stop = free[0].token_ids[2]
    gens = Sampler(model).generate_full(prompts, SamplingParams(5, temperature=0.0, stop_ids=[stop]))
    for f, g in zip(free, gens):
        if stop in f.token_ids:
            cut = f.token_ids.index(stop) + 1
            assert g.token_ids == f.token_ids[:cut] and g.finish_reason == "stop"
        else:
            assert g.token_ids == f.token_ids and g.finish_reason == "length"
    assert gens[0].token_ids[-1] == stop and len(gens[0].token_ids) <= 3


def test_returned_logprobs_are_temperature_scaled_logprobs(model):
    prompts = random_prompts(4, seed=4)
    temperature = 0.7
    gens = Sampler(model, seed=5).generate_full(prompts, SamplingParams(4, temperature=temperature))
    for prompt, gen in zip(prompts, gens):
        for t, (token, logprob) in enumerate(zip(gen.token_ids, gen.logprobs)):
            logits = last_logits(model, [prompt + gen.token_ids[:t]])[0]
            expected = torch.log_softmax(logits / temperature, -1)[token].item()
            assert abs(logprob - expected) < 1e-4


def test_temperature_zero_is_deterministic_whatever_the_seed(model):
    prompts = random_prompts(5, seed=6)
    a = Sampler(model, seed=1).generate(prompts, SamplingParams(8, temperature=0.0))
    b = Sampler(model, seed=2).generate(prompts, SamplingParams(8, temperature=0.0, top_p=0.5))
    assert a == b


def test_seeded_sampling_is_reproducible_and_seed_dependent(model):
    prompts = random_prompts(6, seed=7)
    sampler = Sampler(model, seed=3)
    first = sampler.generate(prompts, SamplingParams(10, temperature=1.5))
    assert Sampler(model, seed=3).generate(prompts, SamplingParams(10, temperature=1.5)) == first
    assert sampler.generate(prompts, SamplingParams(10, temperature=1.5, seed=3)) == first  # reseeding per call
    assert Sampler(model, seed=4).generate(prompts, SamplingParams(10, temperature=1.5)) != first
    # the cache does not change what is sampled: the same random draws meet the same distributions
    assert Sampler(model, seed=3, use_cache=False).generate(prompts, SamplingParams(10, temperature=1.5)) == first


def test_tiny_top_p_is_greedy(model):
    prompts = random_prompts(5, seed=8)
    greedy = Sampler(model).generate(prompts, SamplingParams(6, temperature=0.0))
    assert Sampler(model, seed=9).generate(prompts, SamplingParams(6, temperature=1.0, top_p=1e-6)) == greedy


def test_chunked_batches_give_the_same_tokens(model):
    prompts = random_prompts(7, seed=9)
    params = SamplingParams(6, temperature=0.0, stop_ids=[5])
    whole = Sampler(model).generate(prompts, params)
    assert Sampler(model, max_batch_sequences=3).generate(prompts, params) == whole


def test_model_mode_is_restored(model):
    model.train()
    Sampler(model).generate([[1, 2]], SamplingParams(2, temperature=0.0))
    assert model.training
    model.eval()


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        (([[]], 4), {}, "prompt 0 is empty"),
        (([[1, VOCAB]], 4), {}, "prompt 0 holds 300"),
        (([[1, -1]], 4), {}, "prompt 0 holds -1"),
        (([[1]], 0), {}, "max_new_tokens"),
        (([[1]], 4), {"temperature": -1.0}, "temperature"),
        (([[1]], 4), {"top_p": 0.0}, "top_p"),
    ],
)
def test_bad_input_is_named(model, args, kwargs, match):
    prompts, max_new_tokens = args
    with pytest.raises(ValueError, match=match):
        Sampler(model).generate(prompts, SamplingParams(max_new_tokens, **kwargs))


def test_bad_types_are_named(model):
    with pytest.raises(TypeError, match="prompt_token_lists"):
        Sampler(model).generate("hello", SamplingParams(4))
    with pytest.raises(TypeError, match="stop_ids"):
        Sampler(model).generate([[1]], SamplingParams(4, stop_ids=["<|im_end|>"]))
    with pytest.raises(TypeError, match="lm_head_weight"):
        Sampler(torch.nn.Linear(2, 2))


def test_identical_prompts_share_prefill_but_sample_independently(model):
    prompts = random_prompts(2, seed=10) * 4  # a GRPO group: the same prompt N times
    greedy = Sampler(model).generate(prompts, SamplingParams(6, temperature=0.0, stop_ids=[5]))
    assert greedy == reference_greedy(model, prompts, 6, [5])
    sampled = Sampler(model, seed=11).generate(prompts, SamplingParams(6, temperature=2.0))
    assert len({tuple(s) for s in sampled[0::2]}) > 1
    assert Sampler(model, seed=11, use_cache=False).generate(prompts, SamplingParams(6, temperature=2.0)) == sampled


def test_greedy_generation_of_a_repeated_prompt_runs_once(model, monkeypatch):
    prompts = random_prompts(3, seed=12) * 3  # a group's identical trajectories asked for their skill
    rows = []
    decode = model.decode

    def counting_decode(ids, cache):
        rows.append(ids.shape[0])
        return decode(ids, cache)

    monkeypatch.setattr(model, "decode", counting_decode)
    gens = Sampler(model).generate_full(prompts, SamplingParams(5, temperature=0.0))
    assert [g.token_ids for g in gens] == reference_greedy(model, prompts, 5, [])
    assert rows and max(rows) == 3  # the three distinct prompts, not nine rows
    assert [g.logprobs for g in gens[3:6]] == [g.logprobs for g in gens[:3]]
    gens[0].token_ids.append(-1)  # each copy is its own list
    assert gens[3].token_ids[-1] != -1
    monkeypatch.undo()
    # sampling still draws every row
    sampled = Sampler(model, seed=3).generate(prompts, SamplingParams(5, temperature=1.5))
    assert len({tuple(s) for s in sampled[0::3]}) > 1
