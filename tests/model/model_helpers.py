"""Tiny HF configs of the three families and helpers shared by the model tests."""

from __future__ import annotations

import torch
import transformers

from seedfast.model import Decoder, DecoderConfig, make_cu_seqlens

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}

# name -> (HF config class, kwargs): every family, GQA everywhere, tied and untied, llama3 rope scaling
FAMILIES = {
    "llama-untied-llama3rope": (transformers.LlamaConfig, {"rope_parameters": LLAMA3_ROPE}),
    "llama-tied-bias": (transformers.LlamaConfig, {"tie_word_embeddings": True, "attention_bias": True,
                                                   "mlp_bias": True}),
    "qwen2-tied": (transformers.Qwen2Config, {"tie_word_embeddings": True,
                                              "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
    "qwen2-untied": (transformers.Qwen2Config, {}),
    "qwen3-untied": (transformers.Qwen3Config, {"head_dim": 16}),
    "qwen3-tied": (transformers.Qwen3Config, {"head_dim": 8, "tie_word_embeddings": True,
                                              "rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                                                  "rope_theta": 10000.0}}),
}

TINY = {
    "vocab_size": 97,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def hf_config(family: str, **overrides):
    cls, kwargs = FAMILIES[family]
    return cls(**{**TINY, **kwargs, **overrides})


def randomize_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random weights everywhere, norms and biases included (HF's init sets those to 1 and 0, which would hide
    a missing bias or a norm applied to the wrong tensor)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return model


def hf_and_ours(family: str, seed: int = 0, **overrides) -> tuple[torch.nn.Module, Decoder]:
    """A random-weight transformers *ForCausalLM and our Decoder holding the same weights (fp32, eval)."""
    config = hf_config(family, **overrides)
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    randomize_(hf, seed)
    ours = Decoder(DecoderConfig.from_hf(config)).eval()
    state = hf.state_dict()
    if config.tie_word_embeddings:
        assert state["lm_head.weight"] is state["model.embed_tokens.weight"] or torch.equal(
            state["lm_head.weight"], state["model.embed_tokens.weight"]
        )
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    ours.load_state_dict(state, strict=True)
    return hf, ours


def tiny_decoder(family: str = "qwen3-untied", seed: int = 0, **overrides) -> Decoder:
    model = Decoder(DecoderConfig.from_hf(hf_config(family, **overrides))).eval()
    return randomize_(model, seed)


def random_packed(
    lengths: list[int], vocab: int, seed: int = 0
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Random token sequences of the given lengths, packed: (per-sequence ids, flat ids [T], cu_seqlens)."""
    gen = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(0, vocab, (n,), generator=gen) for n in lengths]
    flat = torch.cat(seqs) if seqs else torch.zeros(0, dtype=torch.int64)
    return seqs, flat, make_cu_seqlens(lengths)
