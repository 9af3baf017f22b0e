import math
import random

import pytest
import torch

from seedfast.model import DecoderConfig, build_decoder
from seedfast.sft.copy_warmup import copy_example, copy_examples, copy_warmup
from seedfast.sft.loop import pack, token_logprobs


def test_a_copy_example_is_string_gap_string_with_the_loss_on_the_repeat():
    ex = copy_example(random.Random(0), [5, 6, 7, 8, 9], length=4, gap=3, source="t")
    ids = ex.input_ids
    assert len(ids) == 11 and ids[:4] == ids[7:] and ex.kind == "copy" and ex.answer_start == 7
    # targets: the 2nd..4th tokens of the repeat (nothing says where the repeat starts)
    assert [t for t, m in enumerate(ex.loss_mask) if m] == [8, 9, 10]


def test_copy_examples_are_seeded_and_vary_in_length_and_gap():
    a = copy_examples(list(range(2, 50)), 3000, seed=1, length=(4, 12), gap=(0, 20))
    assert [e.input_ids for e in a] == [e.input_ids for e in copy_examples(list(range(2, 50)), 3000, seed=1,
                                                                          length=(4, 12), gap=(0, 20))]
    assert sum(len(e.input_ids) for e in a) >= 3000
    lengths = {len(e.input_ids) - e.answer_start for e in a}
    gaps = {e.answer_start - (len(e.input_ids) - e.answer_start) for e in a}
    assert lengths == set(range(4, 13)) and min(gaps) == 0 and max(gaps) == 20
    with pytest.raises(ValueError, match="at least 2 token ids"):
        copy_examples([3], 10)
    with pytest.raises(ValueError, match="gap"):
        copy_examples([3, 4], 10, gap=(5, 1))


def _copy_nll(model: torch.nn.Module, tokens: list[int], length: int, gap: int) -> float:
    rng = random.Random(1234)
    batch = pack([copy_example(rng, tokens, length, gap, "eval") for _ in range(32)], "cpu")
    with torch.no_grad():
        return float(-token_logprobs(model, batch).mean())


def test_the_warmup_teaches_copying_by_content_not_by_a_fixed_offset():
    # with one fixed string length a model learns "copy from `length` back" (a rotary offset) and copies
    # nothing at any other length; varied lengths and gaps leave content matching (an induction head) as the
    # only solution, so it copies at every length and gap of the range
    cfg = DecoderConfig(model_type="qwen3", vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                        tie_word_embeddings=True, eos_token_id=0, pad_token_id=0)
    model = build_decoder(cfg, dtype=torch.float32, seed=0)
    tokens = list(range(2, 64))
    chance = math.log(len(tokens))
    before = [_copy_nll(model, tokens, length, gap) for length, gap in ((6, 0), (15, 37))]
    logs = []
    copy_warmup(model, tokens, steps=700, lr=1e-3, batch_tokens=1024, seed=0, log_fn=logs.append)
    model.eval()
    after = [_copy_nll(model, tokens, length, gap) for length, gap in ((6, 0), (15, 37))]
    assert min(before) > 0.8 * chance
    assert max(after) < 0.5 * chance, (before, after, [round(r["loss"], 2) for r in logs[::50]])
    assert copy_warmup(model, tokens, steps=0) is None
