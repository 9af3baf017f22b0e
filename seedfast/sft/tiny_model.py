"""The model SFT starts from: the base model (model.path), or a from-scratch tiny decoder (model.tiny) for the
run's tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from seedfast.config import Config, ConfigError
from seedfast.model import DecoderConfig, build_decoder, load_hf
from seedfast.model.tokenizer import train_tokenizer
from seedfast.runtime.setup import base_policy_path
from seedfast.sft.tokenizer import initial_tokenizer


def build_tiny(cfg: Config, texts: Sequence[str], tokenizer: Any = None) -> tuple[torch.nn.Module, Any]:
    """(decoder, tokenizer) from scratch: a byte-level BPE trained on `texts` (unless `tokenizer` is given)
    and the model.tiny decoder (Qwen3 style; Llama style without qk_norm), fp32, initialized with run.seed."""
    tiny = cfg.model.tiny
    if tokenizer is None:
        tokenizer = train_tokenizer(list(texts), vocab_size=tiny.bpe_vocab_size,
                                    min_frequency=tiny.bpe_min_frequency)
    vocab = tiny.vocab_size if tiny.vocab_size is not None else len(tokenizer)
    if vocab < len(tokenizer):
        raise ConfigError(f"model.tiny.vocab_size={vocab} is below the tokenizer's {len(tokenizer)} tokens")
    config = DecoderConfig(
        model_type="qwen3" if tiny.qk_norm else "llama", vocab_size=vocab, hidden_size=tiny.hidden,
        intermediate_size=tiny.intermediate, num_hidden_layers=tiny.layers, num_attention_heads=tiny.heads,
        num_key_value_heads=tiny.kv_heads, max_position_embeddings=tiny.max_seq_len,
        rope_theta=tiny.rope_theta, tie_word_embeddings=tiny.tie_embeddings,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = build_decoder(config, dtype=torch.float32, attn_backend=cfg.model.attn_backend, seed=cfg.run.seed)
    return model, tokenizer


def initial_policy(cfg: Config, corpus: Sequence[str]) -> tuple[torch.nn.Module, Any]:
    """(fp32 model, tokenizer): the base model (runtime/setup.py base_policy_path: model.path) with its tokenizer
    (setup.load_run_tokenizer: model.tokenizer, else model.path's, else <run_dir>/tokenizer); or a tiny decoder
    whose tokenizer is model.tokenizer or <run_dir>/tokenizer if one is there, else trained on `corpus` and saved
    there."""
    tokenizer = initial_tokenizer(cfg, corpus)
    return initial_model(cfg, tokenizer), tokenizer


def initial_model(cfg: Config, tokenizer: Any) -> torch.nn.Module:
    """The fp32 model of `initial_policy`: the base model (model.path), or the tiny decoder for `tokenizer`
    (initialized with run.seed: the same weights in every process)."""
    base = base_policy_path(cfg)
    if base is not None:
        return load_hf(base, dtype=torch.float32, attn_backend=cfg.model.attn_backend)
    return build_tiny(cfg, (), tokenizer)[0]
