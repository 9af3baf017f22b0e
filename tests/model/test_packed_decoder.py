"""Packed forward == one sequence at a time; past KV == recomputing the whole sequence; PackedKV helpers."""

import pytest
import torch

from seedfast.model import PackedKV, make_cu_seqlens
from seedfast.model.packing import positions_in_sequence
from tests.model.model_helpers import random_packed, tiny_decoder

ATOL = 2e-5


def test_packed_equals_one_by_one():
    model = tiny_decoder("qwen3-untied")
    seqs, flat, cu = random_packed([9, 1, 23, 4, 15], model.config.vocab_size)
    with torch.no_grad():
        packed = model(flat, cu, attn_backend="sdpa")
        for b, ids in enumerate(seqs):
            alone = model(ids, make_cu_seqlens([len(ids)]), attn_backend="sdpa")
            torch.testing.assert_close(packed[cu[b] : cu[b + 1]], alone, rtol=0, atol=ATOL)


def test_default_position_ids_restart_per_sequence_and_follow_the_past():
    assert positions_in_sequence([0, 3, 3, 5], torch.device("cpu")).tolist() == [0, 1, 2, 0, 1]
    assert positions_in_sequence([0, 3, 3, 5], torch.device("cpu"), [4, 9, 0]).tolist() == [4, 5, 6, 0, 1]
    model = tiny_decoder("llama-untied-llama3rope")
    _, flat, cu = random_packed([5, 7], model.config.vocab_size)
    restart = torch.cat([torch.arange(5), torch.arange(7)])
    gapped = torch.cat([torch.arange(5), torch.tensor([0, 1, 2, 10, 11, 12, 13])])
    with torch.no_grad():
        default = model(flat, cu)
        torch.testing.assert_close(model(flat, cu, position_ids=restart), default, rtol=0, atol=0)
        moved = model(flat, cu, position_ids=gapped)
    torch.testing.assert_close(moved[:8], default[:8], rtol=0, atol=0)  # same positions up to the gap
    assert not torch.allclose(moved[8:], default[8:], atol=1e-3)


PREFIX = [6, 0, 11, 3]  # includes a sequence with no prefix
SUFFIX = [4, 5, 1, 7]


# flex on CPU costs seconds of dynamo tracing per new head layout: one family, the layout of the attention tests
@pytest.mark.parametrize(
    "family, backend", [("qwen2-tied", "sdpa"), ("qwen3-untied", "sdpa"), ("qwen3-tied", "flex")]
)
def test_past_kv_equals_full_forward(family, backend):
    model = tiny_decoder(family)
    V = model.config.vocab_size
    pre, pre_flat, pre_cu = random_packed(PREFIX, V, seed=1)
    suf, suf_flat, suf_cu = random_packed(SUFFIX, V, seed=2)
    full = [torch.cat([p, s]) for p, s in zip(pre, suf)]
    full_cu = make_cu_seqlens([len(x) for x in full])
    with torch.no_grad():
        expected = model(torch.cat(full), full_cu, attn_backend=backend)
        _, kv = model(pre_flat, pre_cu, return_kv=True, attn_backend=backend)
        got = model(suf_flat, suf_cu, past=kv, attn_backend=backend)
    for b in range(len(SUFFIX)):
        rows = slice(int(full_cu[b]) + PREFIX[b], int(full_cu[b + 1]))
        torch.testing.assert_close(got[suf_cu[b] : suf_cu[b + 1]], expected[rows], rtol=0, atol=ATOL)


def test_gradients_through_past_kv_equal_full_forward():
    """prefix (with grad, return_kv) then suffix (past=kv) backpropagates exactly like one full forward."""
    model = tiny_decoder("qwen3-tied").train()
    V = model.config.vocab_size
    pre, pre_flat, pre_cu = random_packed([5, 0, 2], V, seed=3)
    suf, suf_flat, suf_cu = random_packed([3, 2, 4], V, seed=4)
    _, kv = model(pre_flat, pre_cu, return_kv=True, attn_backend="sdpa")
    model(suf_flat, suf_cu, past=kv, attn_backend="sdpa").square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    full = [torch.cat([p, s]) for p, s in zip(pre, suf)]
    h = model(torch.cat(full), make_cu_seqlens([8, 2, 6]), attn_backend="sdpa")
    torch.cat([h[5:8], h[8:10], h[12:16]]).square().sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_generation_by_concat_equals_full_forward():
    model = tiny_decoder("llama-tied-bias")
    seqs, flat, cu = random_packed([4, 2, 6], model.config.vocab_size, seed=5)
    steps = [torch.randint(0, model.config.vocab_size, (3,)) for _ in range(3)]  # one token per sequence per step
    one_each = make_cu_seqlens([1, 1, 1])
    with torch.no_grad():
        _, kv = model(flat, cu, return_kv=True)
        outs = []
        for tokens in steps:
            h, new = model(tokens, one_each, past=kv, return_kv=True)
            kv = kv.concat(new)
            outs.append(h)
        full = [torch.cat([s, torch.stack([t[b] for t in steps])]) for b, s in enumerate(seqs)]
        full_cu = make_cu_seqlens([len(x) for x in full])
        expected = model(torch.cat(full), full_cu)
    assert kv.lengths.tolist() == [7, 5, 9]
    for b in range(3):
        last = expected[int(full_cu[b + 1]) - 3 : int(full_cu[b + 1])]
        torch.testing.assert_close(torch.stack([o[b] for o in outs]), last, rtol=0, atol=ATOL)


def test_shared_prefix_repeated_for_two_branches():
    """The scorer's pattern: one prefix pass, repeat_interleave(2), student and teacher suffixes."""
    model = tiny_decoder("qwen2-untied")
    V = model.config.vocab_size
    pre, pre_flat, pre_cu = random_packed([5, 8], V, seed=6)
    branches, flat, cu = random_packed([3, 6, 2, 4], V, seed=7)  # student0, teacher0, student1, teacher1
    with torch.no_grad():
        _, kv = model(pre_flat, pre_cu, return_kv=True)
        got = model(flat, cu, past=kv.repeat_interleave(2))
        for j, branch in enumerate(branches):
            whole = torch.cat([pre[j // 2], branch])
            ref = model(whole, make_cu_seqlens([len(whole)]))[len(pre[j // 2]) :]
            torch.testing.assert_close(got[cu[j] : cu[j + 1]], ref, rtol=0, atol=ATOL)


def _kv(lengths, layers=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    return PackedKV(
        [torch.randn(T, 2, 3, generator=gen) for _ in range(layers)],
        [torch.randn(T, 2, 3, generator=gen) for _ in range(layers)],
        make_cu_seqlens(lengths),
    )


def _split(kv, layer=0, values=False):
    t = (kv.values if values else kv.keys)[layer]
    cu = kv.cu_seqlens.tolist()
    return [t[a:b] for a, b in zip(cu, cu[1:])]


def test_packed_kv_select_reorders_repeats_and_drops():
    kv = _kv([2, 0, 3, 1])
    picked = kv.select([3, 0, 0, 1])
    assert picked.lengths.tolist() == [1, 2, 2, 0]
    assert picked.num_sequences == 4 and picked.num_tokens == 5 and picked.num_layers == 2
    for layer in range(2):
        for values in (False, True):
            src, out = _split(kv, layer, values), _split(picked, layer, values)
            for j, i in enumerate([3, 0, 0, 1]):
                assert torch.equal(out[j], src[i])


def test_packed_kv_repeat_interleave_and_concat():
    kv = _kv([2, 3])
    rep = kv.repeat_interleave(2)
    assert [x.shape[0] for x in _split(rep)] == [2, 2, 3, 3]
    assert torch.equal(_split(rep)[1], _split(kv)[0]) and torch.equal(_split(rep)[2], _split(kv)[1])
    assert kv.repeat_interleave(torch.tensor([0, 2])).lengths.tolist() == [3, 3]
    new = _kv([1, 0], seed=1)
    both = kv.concat(new)
    assert both.lengths.tolist() == [3, 3]
    for values in (False, True):
        a, b, c = _split(kv, 1, values), _split(new, 1, values), _split(both, 1, values)
        for i in range(2):
            assert torch.equal(c[i], torch.cat([a[i], b[i]]))


def test_packed_kv_rejects_inconsistent_input():
    kv = _kv([2, 3])
    with pytest.raises(ValueError, match="index must lie in"):
        kv.select([2])
    with pytest.raises(ValueError, match="same sequences and layers"):
        kv.concat(_kv([1]))
    with pytest.raises(ValueError, match="layer 1"):
        PackedKV([kv.keys[0], kv.keys[1][:1]], kv.values, kv.cu_seqlens)
    with pytest.raises(ValueError, match="int32"):
        PackedKV(kv.keys, kv.values, kv.cu_seqlens.long())
    with pytest.raises(ValueError, match="past.cu_seqlens must end at the number of tokens 5"):
        PackedKV(kv.keys, kv.values, make_cu_seqlens([2, 2])).check()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["flex", "flash"])
def test_cuda_backends_agree_with_sdpa_in_the_decoder(backend):
    from seedfast.model.attention_flash import installed as flash_installed

    if backend == "flash" and not flash_installed():
        pytest.skip("flash-attn is not installed")
    model = tiny_decoder("qwen3-untied").to("cuda", torch.bfloat16)
    V = model.config.vocab_size
    _, pre_flat, pre_cu = random_packed(PREFIX, V, seed=1)
    _, suf_flat, suf_cu = random_packed(SUFFIX, V, seed=2)
    pre_flat, pre_cu, suf_flat, suf_cu = (x.cuda() for x in (pre_flat, pre_cu, suf_flat, suf_cu))
    results = {}
    for name in ("sdpa", backend):
        model.zero_grad()
        _, kv = model(pre_flat, pre_cu, return_kv=True, attn_backend=name)
        hidden = model(suf_flat, suf_cu, past=kv, attn_backend=name)
        hidden.float().square().mean().backward()
        results[name] = (hidden.float(), model.model.layers[0].self_attn.q_proj.weight.grad.float())
    torch.testing.assert_close(results[backend][0], results["sdpa"][0], rtol=0.02, atol=0.03)
    torch.testing.assert_close(results[backend][1], results["sdpa"][1], rtol=0.05, atol=1e-3)
