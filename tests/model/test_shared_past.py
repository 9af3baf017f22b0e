"""`past_owner`: sequences that share a past read it where it is held once (model/attention_shared_past.py). Each
sequence's hidden states and keys/values equal a from-scratch forward of its past followed by it (fp64, every
family), and the varlen path over a past copied per sequence; kept rows (keep_last) equal the full forward's; bad
owners are one clear error."""

import pytest
import torch

from seedfast.model import attention_shared_past, make_cu_seqlens
from tests.model.model_helpers import FAMILIES, random_packed, tiny_decoder

PASTS = [6, 0, 11]  # an empty past included
LENGTHS = [4, 1, 0, 7, 3, 5]  # an empty sequence included
OWNER = [2, 0, 2, 1, 2, 0]  # in no particular order; past 2 read three times


def shared_and_scratch(model, seed=0):
    V = model.config.vocab_size
    pasts, past_flat, past_cu = random_packed(PASTS, V, seed=seed)
    seqs, flat, cu = random_packed(LENGTHS, V, seed=seed + 1)
    with torch.no_grad():
        _, past = model(past_flat, past_cu, return_kv=True, attn_backend="sdpa")
        shared, shared_kv = model(flat, cu, past=past, past_owner=OWNER, return_kv=True)
        copied = model(flat, cu, past=past.select(OWNER), attn_backend="sdpa")
        whole = [torch.cat([pasts[o], s]) for o, s in zip(OWNER, seqs)]
        scratch, scratch_kv = model(torch.cat(whole), make_cu_seqlens([len(w) for w in whole]), return_kv=True,
                                    attn_backend="sdpa")
    starts = make_cu_seqlens([len(w) for w in whole])
    own = torch.cat([torch.arange(int(starts[b]) + PASTS[o], int(starts[b + 1])) for b, o in enumerate(OWNER)])
    return shared, shared_kv, copied, scratch[own], [(k[own], v[own]) for k, v in zip(scratch_kv.keys,
                                                                                           scratch_kv.values)]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_shared_past_equals_a_forward_from_scratch(family):
    model = tiny_decoder(family).double()
    shared, shared_kv, copied, scratch, scratch_kv = shared_and_scratch(model)
    assert shared.shape == (sum(LENGTHS), model.config.hidden_size)
    torch.testing.assert_close(shared, scratch, rtol=0, atol=1e-10)
    torch.testing.assert_close(shared, copied, rtol=0, atol=1e-10)
    for (k, v), k_ours, v_ours in zip(scratch_kv, shared_kv.keys, shared_kv.values):
        torch.testing.assert_close(k_ours, k, rtol=0, atol=1e-10)
        torch.testing.assert_close(v_ours, v, rtol=0, atol=1e-10)


def test_rows_split_into_blocks_and_fp32_give_the_same(monkeypatch):
    model = tiny_decoder("qwen2-untied")
    _, _, copied, scratch, _ = shared_and_scratch(model, seed=3)
    monkeypatch.setattr(attention_shared_past, "ROW_BLOCK", 3)  # past 2's 12 rows in four blocks
    shared = shared_and_scratch(model, seed=3)[0]
    torch.testing.assert_close(shared, scratch, rtol=0, atol=2e-5)
    torch.testing.assert_close(shared, copied, rtol=0, atol=2e-5)


def test_kept_rows_equal_the_full_forward_and_bad_owners_are_named():
    model = tiny_decoder("qwen3-tied").double()
    V = model.config.vocab_size
    _, past_flat, past_cu = random_packed(PASTS, V, seed=0)
    _, flat, cu = random_packed(LENGTHS, V, seed=1)
    keep = [2, 1, 0, 7, 0, 3]  # a cut, a whole sequence, an empty one, all of one, none
    with torch.no_grad():
        _, past = model(past_flat, past_cu, return_kv=True)
        full = model(flat, cu, past=past, past_owner=OWNER)
        kept = model(flat, cu, past=past, past_owner=OWNER, keep_last=keep)
        index = torch.tensor([t for b, n in enumerate(keep) for t in range(int(cu[b + 1]) - n, int(cu[b + 1]))])
        torch.testing.assert_close(kept, full[index], rtol=0, atol=1e-10)
        with pytest.raises(ValueError, match=r"past_owner\[3\]=3 must lie in \[0, 3\)"):
            model(flat, cu, past=past, past_owner=[2, 0, 2, 3, 2, 0])
        with pytest.raises(ValueError, match="past_owner has 2 entries for 6 sequences"):
            model(flat, cu, past=past, past_owner=[0, 1])
        with pytest.raises(ValueError, match=r"keep_last\[1\]=2 must lie in \[0, 1\]"):
            model(flat, cu, past=past, past_owner=OWNER, keep_last=[1, 2, 0, 0, 0, 0])
        with pytest.raises(ValueError, match="past_owner needs a past"):
            model(flat, cu, past_owner=OWNER)
