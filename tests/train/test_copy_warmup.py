import math

import torch

from seedfast.model import DecoderConfig, build_decoder
from seedfast.train.copy_warmup import copy_batch, copy_warmup


def test_copy_batch_repeats_each_string_and_targets_the_repeat():
    ids, cu, rows, targets = copy_batch([5, 6, 7, 8, 9], batch=3, length=4, generator=torch.Generator().manual_seed(0))
    assert ids.shape == (24,) and cu.tolist() == [0, 8, 16, 24]
    seqs = ids.reshape(3, 8)
    assert torch.equal(seqs[:, :4], seqs[:, 4:]) and set(ids.tolist()) <= {5, 6, 7, 8, 9}
    # rows 4..6 of each sequence predict tokens 5..7, i.e. the 2nd..4th tokens of the string
    assert rows.tolist() == [4, 5, 6, 12, 13, 14, 20, 21, 22]
    assert torch.equal(targets.reshape(3, 3), seqs[:, 1:4])


def test_a_small_decoder_learns_to_copy_in_the_warmup():
    cfg = DecoderConfig(model_type="qwen3", vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                        tie_word_embeddings=True, eos_token_id=0, pad_token_id=0)
    model = build_decoder(cfg, dtype=torch.float32, seed=0)
    tokens = list(range(2, 64))
    logs = []
    last = copy_warmup(model, tokens, steps=200, lr=3e-3, batch=16, length=16, seed=0, log_fn=logs.append)
    assert logs[0]["loss"] > 0.8 * math.log(len(tokens))  # starts at chance
    assert last < 0.25 * math.log(len(tokens)), [round(r["loss"], 2) for r in logs[::20]]  # copies
    assert copy_warmup(model, tokens, steps=0) is None
