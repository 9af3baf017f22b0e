"""Decoder.prefill + Decoder.decode over a StaticKVCache == the full forward without a cache, every family."""

import pytest
import torch

from seedfast.model import make_cu_seqlens
from seedfast.model.kv import StaticKVCache
from tests.model.model_helpers import FAMILIES, random_packed, tiny_decoder

ATOL = 2e-5
PROMPTS = [9, 1, 17, 4]  # ragged, one single-token prompt
STEPS = 4


def last_hidden(model, seqs):
    """Reference: each whole sequence through the packed forward, hidden state of its last token."""
    cu = make_cu_seqlens([len(s) for s in seqs])
    return model(torch.cat(seqs), cu)[cu[1:].long() - 1]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_decode_equals_full_forward(family):
    model = tiny_decoder(family)
    V = model.config.vocab_size
    prompts, flat, cu = random_packed(PROMPTS, V, seed=1)
    fed = torch.randint(0, V, (len(PROMPTS), STEPS), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        hidden, cache = model.prefill(flat, cu, capacity=max(PROMPTS) + STEPS)
        torch.testing.assert_close(hidden, model(flat, cu)[cu[1:].long() - 1], rtol=0, atol=ATOL)
        for step in range(STEPS):
            got = model.decode(fed[:, step], cache)
            expected = last_hidden(model, [torch.cat([p, f[: step + 1]]) for p, f in zip(prompts, fed)])
            torch.testing.assert_close(got, expected, rtol=0, atol=ATOL)
    assert cache.lengths.tolist() == [n + STEPS for n in PROMPTS]


def test_decode_after_dropping_and_repeating_rows():
    model = tiny_decoder("qwen3-tied")
    V = model.config.vocab_size
    prompts, flat, cu = random_packed(PROMPTS, V, seed=3)
    rows = torch.tensor([2, 0, 2, 3])  # sequence 2 twice (a shared prompt), sequence 1 not at all
    with torch.no_grad():
        _, cache = model.prefill(flat, cu, capacity=max(PROMPTS) + 3, rows=rows)
        assert cache.lengths.tolist() == [PROMPTS[r] for r in rows.tolist()]
        seqs = [prompts[r] for r in rows.tolist()]
        for tokens in ([5, 6, 7, 8], [1, 2, 3, 4]):
            got = model.decode(torch.tensor(tokens), cache)
            seqs = [torch.cat([s, torch.tensor([t])]) for s, t in zip(seqs, tokens)]
            torch.testing.assert_close(got, last_hidden(model, seqs), rtol=0, atol=ATOL)
        keep = torch.tensor([3, 1])
        cache = cache.select(keep)
        seqs = [seqs[i] for i in keep.tolist()]
        got = model.decode(torch.tensor([9, 10]), cache)
        seqs = [torch.cat([s, torch.tensor([t])]) for s, t in zip(seqs, [9, 10])]
        torch.testing.assert_close(got, last_hidden(model, seqs), rtol=0, atol=ATOL)


def test_decode_and_forward_run_the_same_layer_modules():
    """One copy of the layer math: both paths go through Attention.qkv and DecoderLayer.mlp_residual."""
    model = tiny_decoder("qwen3-untied")
    calls = []
    for layer in model.model.layers:
        layer.self_attn.qkv = _counting(layer.self_attn.qkv, calls, "qkv")
        layer.mlp_residual = _counting(layer.mlp_residual, calls, "mlp")
    _, flat, cu = random_packed([3, 2], model.config.vocab_size)
    with torch.no_grad():
        _, cache = model.prefill(flat, cu, capacity=6)
        forward_calls = list(calls)
        model.decode(torch.tensor([1, 2]), cache)
    layers = model.config.num_hidden_layers
    assert forward_calls == ["qkv", "mlp"] * layers
    assert calls[len(forward_calls) :] == ["qkv", "mlp"] * layers


def _counting(fn, calls, name):
    def wrapped(*args, **kwargs):
        calls.append(name)
        return fn(*args, **kwargs)

    return wrapped


def test_bad_decode_input_is_named():
    model = tiny_decoder("llama-tied-bias")
    _, flat, cu = random_packed([3, 2], model.config.vocab_size)
    with torch.no_grad():
        _, cache = model.prefill(flat, cu, capacity=4)
        with pytest.raises(ValueError, match=r"input_ids must be \[2\]"):
            model.decode(torch.tensor([1, 2, 3]), cache)
        with pytest.raises(TypeError, match="StaticKVCache"):
            model.decode(torch.tensor([1, 2]), object())
        short = StaticKVCache(cache.keys[:1], cache.values[:1], cache.lengths)
        with pytest.raises(ValueError, match="cache has 1 layers"):
            model.decode(torch.tensor([1, 2]), short)
        model.decode(torch.tensor([1, 2]), cache)  # row 0 is now full
        assert cache.lengths.tolist() == [4, 3]
        with pytest.raises(ValueError, match="KV cache is full"):
            model.decode(torch.tensor([1, 2]), cache)
        with pytest.raises(ValueError, match="capacity=2 is below"):
            model.prefill(flat, cu, capacity=2)
