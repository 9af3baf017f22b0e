"""`keep_last`: the last layer runs only the rows that are read (model/decoder.py). The kept rows' hidden states, the
keys and values `return_kv` returns, and the gradients equal those of the full forward indexed afterwards, with and
without a past, under gradient checkpointing too; a count that does not fit its sequence is one clear error."""

import pytest
import torch

from seedfast.model import make_cu_seqlens
from tests.model.model_helpers import FAMILIES, random_packed, tiny_decoder

ATOL = 2e-5
LENGTHS = [9, 1, 0, 23, 4]
KEEP = [3, 1, 0, 0, 4]  # a middle cut, a whole one-token sequence, an empty sequence, none kept, all kept


def kept_index(cu: torch.Tensor, keep: list[int]) -> torch.Tensor:
    return torch.tensor([t for b, n in enumerate(keep) for t in range(int(cu[b + 1]) - n, int(cu[b + 1]))],
                        dtype=torch.long)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_kept_rows_and_kv_equal_the_full_forward(family):
    model = tiny_decoder(family)
    _, flat, cu = random_packed(LENGTHS, model.config.vocab_size, seed=5)
    with torch.no_grad():
        full, full_kv = model(flat, cu, return_kv=True, attn_backend="sdpa")
        kept, kv = model(flat, cu, return_kv=True, attn_backend="sdpa", keep_last=KEEP)
    assert kept.shape == (sum(KEEP), model.config.hidden_size)
    torch.testing.assert_close(kept, full[kept_index(cu, KEEP)], rtol=0, atol=ATOL)
    for layer in range(model.config.num_hidden_layers):  # every token's keys and values, the last layer's too
        torch.testing.assert_close(kv.keys[layer], full_kv.keys[layer], rtol=0, atol=ATOL)
        torch.testing.assert_close(kv.values[layer], full_kv.values[layer], rtol=0, atol=ATOL)


def test_kept_rows_after_a_past_equal_the_full_forward():
    model = tiny_decoder("qwen3-tied")
    V = model.config.vocab_size
    pre, pre_flat, pre_cu = random_packed([6, 0, 11], V, seed=1)
    suf, suf_flat, suf_cu = random_packed([4, 5, 2], V, seed=2)
    keep = [2, 5, 1]
    full = [torch.cat([p, s]) for p, s in zip(pre, suf)]
    full_cu = make_cu_seqlens([len(x) for x in full])
    with torch.no_grad():
        expected = model(torch.cat(full), full_cu, attn_backend="sdpa")[kept_index(full_cu, keep)]
        _, kv = model(pre_flat, pre_cu, return_kv=True, attn_backend="sdpa")
        got = model(suf_flat, suf_cu, past=kv, attn_backend="sdpa", keep_last=keep)
    torch.testing.assert_close(got, expected, rtol=0, atol=ATOL)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_gradients_equal_the_full_forward_indexed(checkpointing):
    # fp64: the keys' bias gets a gradient of ~0 (a shift of every key leaves the softmax alone), fp32 noise there
    model = tiny_decoder("qwen2-tied").double().train()  # q/k/v bias: every projection's gradient is checked
    model.gradient_checkpointing = checkpointing
    _, flat, cu = random_packed(LENGTHS, model.config.vocab_size, seed=6)
    weight = torch.randn(sum(KEEP), model.config.hidden_size, generator=torch.Generator().manual_seed(7),
                         dtype=torch.float64)
    (model(flat, cu, attn_backend="sdpa", keep_last=KEEP) * weight).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    (model(flat, cu, attn_backend="sdpa")[kept_index(cu, KEEP)] * weight).sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-9, atol=1e-10, msg=name)


def test_prefill_returns_each_prompts_last_hidden_state():
    model = tiny_decoder("llama-tied-bias")
    _, flat, cu = random_packed([5, 1, 8], model.config.vocab_size, seed=8)
    with torch.no_grad():
        last, cache = model.prefill(flat, cu, capacity=12)
        torch.testing.assert_close(last, model(flat, cu)[cu[1:].long() - 1], rtol=0, atol=ATOL)
    assert cache.lengths.tolist() == [5, 1, 8]


@pytest.mark.parametrize("keep, message", [([1, 2], r"keep_last has 2 entries for 3 sequences"),
                                           ([1, 1, 9], r"keep_last\[2\]=9 must lie in \[0, 8\]"),
                                           ([-1, 0, 0], r"keep_last\[0\]=-1 must lie in \[0, 5\]")])
def test_a_count_that_does_not_fit_is_named(keep, message):
    model = tiny_decoder("qwen3-tied")
    _, flat, cu = random_packed([5, 1, 8], model.config.vocab_size, seed=9)
    with pytest.raises(ValueError, match=message):
        model(flat, cu, keep_last=keep)
    with pytest.raises(ValueError, match=r"keep_last\[1\]=1 must lie in \[0, 0\]"):  # prefill of an empty prompt
        model.prefill(*random_packed([3, 0], model.config.vocab_size)[1:], capacity=4)
