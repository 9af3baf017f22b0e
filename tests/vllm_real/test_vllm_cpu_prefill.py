"""The REAL vLLM's CPU back end (`make test-vllm`) with a seeded batch larger than its default step budget (4,096
tokens): before the engine turned chunked prefill off there (rollout/vllm_engine.py `whole_prefills`), a prompt split
across steps made vLLM rewind the seeded request's CPU generator with `set_offset` and the engine core died ("CPU
Generator does not use offset"; benchmarks/rollout.py met it at batch 32). Here 32 seeded prompts of 200 tokens
(6,400 tokens) complete, and the same seeds draw the same tokens again. Skipped without vllm."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from tests.vllm_real.vllm_helpers import VOCAB, engine_env, tiny_policy  # noqa: E402

BATCH, PROMPT, NEW_TOKENS = 32, 200, 4


def test_a_seeded_batch_beyond_the_cpu_step_budget_completes_and_repeats(tmp_path):
    from seedfast.rollout.vllm_engine import VLLMEngine
    from seedfast.sampling_params import SamplingParams

    tiny_policy("qwen3", tmp_path)
    engine_env()
    engine = VLLMEngine(str(tmp_path), dtype="fp32", max_model_len=256, enforce_eager=True, max_num_seqs=BATCH)
    try:
        gen = torch.Generator().manual_seed(1)
        prompts = [torch.randint(0, VOCAB, (PROMPT,), generator=gen).tolist() for _ in range(BATCH)]
        assert BATCH * PROMPT > 4096  # more than one step of vLLM's CPU default budget
        first = engine.generate_full(prompts, SamplingParams(NEW_TOKENS, temperature=1.0, seed=7))
        again = engine.generate_full(prompts, SamplingParams(NEW_TOKENS, temperature=1.0, seed=7))
    finally:
        engine.close()
    assert [len(g.token_ids) for g in first] == [NEW_TOKENS] * BATCH
    assert [g.token_ids for g in again] == [g.token_ids for g in first]
