"""Bad input to the decoder gets one clear ValueError/TypeError naming the argument; edge cases work."""

import pytest
import torch

from seedfast.model import Decoder, DecoderConfig, PackedKV, make_cu_seqlens
from seedfast.model.packing import distinct
from tests.model.model_helpers import random_packed, tiny_decoder


@pytest.fixture(scope="module")
def model():
    return tiny_decoder("qwen3-untied")


def _good(model):
    _, flat, cu = random_packed([3, 4], model.config.vocab_size)
    return flat, cu


@pytest.mark.parametrize(
    "mutate, error, match",
    [
        (lambda ids, cu: (ids.int(), cu), ValueError, "input_ids must be int64, got torch.int32"),
        (lambda ids, cu: (ids[None], cu), ValueError, r"input_ids must be 1-D packed \[T\], got shape \(1, 7\)"),
        (lambda ids, cu: (ids.tolist(), cu), TypeError, "input_ids must be a torch.Tensor"),
        (lambda ids, cu: (ids, cu.long()), ValueError, "cu_seqlens must be int32, got torch.int64"),
        (lambda ids, cu: (ids, cu[None]), ValueError, r"cu_seqlens must be 1-D with B\+1 >= 2 entries"),
        (lambda ids, cu: (ids, cu[:1]), ValueError, r"cu_seqlens must be 1-D with B\+1 >= 2 entries"),
        (lambda ids, cu: (ids, cu[:-1]), ValueError, "cu_seqlens must end at the number of tokens 7, got 3"),
        (lambda ids, cu: (ids, cu + 1), ValueError, "cu_seqlens must start at 0, got 1"),
        (lambda ids, cu: (ids * 0 + 97, cu), ValueError, r"input_ids must lie in \[0, vocab_size=97\)"),
        (lambda ids, cu: (ids * 0 - 1, cu), ValueError, r"input_ids must lie in \[0, vocab_size=97\)"),
    ],
)
def test_bad_ids_and_cu_seqlens(model, mutate, error, match):
    ids, cu = mutate(*_good(model))
    with pytest.raises(error, match=match):
        model(ids, cu)


def test_bad_position_ids_backend_and_past(model):
    ids, cu = _good(model)
    with pytest.raises(ValueError, match=r"position_ids must be int64 of shape \(7,\)"):
        model(ids, cu, position_ids=torch.arange(6))
    with pytest.raises(ValueError, match="unknown attention backend 'triton'"):
        model(ids, cu, attn_backend="triton")
    with pytest.raises(ValueError, match="unknown attention backend 'fast'"):
        Decoder(model.config, attn_backend="fast")
    with torch.no_grad():
        _, kv = model(ids, cu, return_kv=True)
    with pytest.raises(ValueError, match="past holds 2 sequences but cu_seqlens describes 1"):
        model(ids, make_cu_seqlens([7]), past=kv)
    with pytest.raises(ValueError, match="past has 1 layers, the model has 2"):
        model(ids, cu, past=PackedKV(kv.keys[:1], kv.values[:1], kv.cu_seqlens))
    with pytest.raises(ValueError, match=r"past is torch.float64 on cpu, the model torch.float32"):
        model(ids, cu, past=kv.to(torch.float64))
    with pytest.raises(TypeError, match="past must be a PackedKV"):
        model(ids, cu, past=(kv.keys, kv.values))


def test_unsupported_model_type_is_named():
    with pytest.raises(ValueError, match="model_type='gemma' is not supported; supported: llama, qwen2, qwen3"):
        DecoderConfig.from_hf({"model_type": "gemma", "vocab_size": 8})


def test_empty_sequences_in_a_batch(model):
    seqs, flat, cu = random_packed([0, 5, 0], model.config.vocab_size)
    with torch.no_grad():
        hidden, kv = model(flat, cu, return_kv=True)
        alone = model(seqs[1], make_cu_seqlens([5]))
    assert hidden.shape == (5, model.config.hidden_size)
    torch.testing.assert_close(hidden, alone, rtol=0, atol=1e-5)
    assert kv.lengths.tolist() == [0, 5, 0]


def test_gradient_checkpointing_gives_the_same_gradients():
    model = tiny_decoder("llama-tied-bias").train()
    _, flat, cu = random_packed([6, 3], model.config.vocab_size)
    model(flat, cu).square().sum().backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.gradient_checkpointing = True
    model(flat, cu).square().sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, plain[name], rtol=0, atol=1e-6, msg=name)


def test_bf16_model_keeps_rotary_frequencies_in_fp32():
    model = tiny_decoder("qwen2-untied").to(torch.bfloat16)
    assert model.inv_freq.dtype == torch.float32
    _, flat, cu = random_packed([5], model.config.vocab_size)
    with torch.no_grad():
        assert model(flat, cu).dtype == torch.bfloat16


def test_distinct_keeps_first_occurrences_and_maps_every_key_to_its_own():
    first, owner = distinct(["b", "a", "b", "c", "a", "b"])
    assert first == [0, 1, 3]
    assert owner == [0, 1, 0, 2, 1, 0]
    assert distinct([]) == ([], [])
