"""Our decoder against transformers' own *ForCausalLM on identical (random) weights, fp32."""

import pytest
import torch

from tests.model.model_helpers import FAMILIES, hf_and_ours, random_packed

LENGTHS = [7, 33, 1, 20]  # 33 > original_max_position_embeddings of the llama3 rope config


@pytest.mark.parametrize("family", list(FAMILIES))
def test_hidden_states_and_logits_match_transformers(family):
    hf, ours = hf_and_ours(family)
    seqs, flat, cu = random_packed(LENGTHS, hf.config.vocab_size)
    with torch.no_grad():
        hidden = ours(flat, cu, attn_backend="sdpa")
        for b, ids in enumerate(seqs):
            ref = hf(ids[None], output_hidden_states=True)
            mine = hidden[cu[b] : cu[b + 1]]
            torch.testing.assert_close(mine, ref.hidden_states[-1][0], rtol=0, atol=1e-4)
            torch.testing.assert_close(mine @ ours.lm_head_weight.T, ref.logits[0], rtol=0, atol=1e-4)


def test_lm_head_weight_is_the_embedding_when_tied_only():
    _, tied = hf_and_ours("qwen2-tied")
    _, untied = hf_and_ours("qwen2-untied")
    assert tied.lm_head_weight is tied.model.embed_tokens.weight
    assert "lm_head.weight" not in tied.state_dict()
    assert untied.lm_head_weight is untied.lm_head.weight
    assert not torch.equal(untied.lm_head_weight, untied.model.embed_tokens.weight)


def test_gradients_match_transformers():
    hf, ours = hf_and_ours("qwen3-untied")
    hf.train(), ours.train()
    _, flat, cu = random_packed([13], hf.config.vocab_size, seed=1)
    (ours(flat, cu) @ ours.lm_head_weight.T).logsumexp(-1).sum().backward()
    hf(flat[None]).logits.logsumexp(-1).sum().backward()
    hf_params = dict(hf.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, hf_params[name].grad, rtol=1e-4, atol=1e-5, msg=name)


def test_bf16_error_is_no_worse_than_transformers_bf16():
    hf, ours = hf_and_ours("llama-untied-llama3rope")
    seqs, flat, cu = random_packed([24], hf.config.vocab_size, seed=2)
    with torch.no_grad():
        exact = hf(seqs[0][None], output_hidden_states=True).hidden_states[-1][0]
        hf, ours = hf.to(torch.bfloat16), ours.to(torch.bfloat16)
        mine = ours(flat, cu, attn_backend="sdpa")
        theirs = hf(seqs[0][None], output_hidden_states=True).hidden_states[-1][0]
    assert mine.dtype == torch.bfloat16
    our_err = (mine.float() - exact).abs().mean()
    their_err = (theirs.float() - exact).abs().mean()
    assert our_err <= 1.25 * their_err, (our_err, their_err)
