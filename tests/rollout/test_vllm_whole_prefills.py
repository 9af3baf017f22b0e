"""The options the vLLM engine adds on vLLM's CPU back end (rollout/vllm_engine.py `whole_prefills`): chunked prefill
off, a step budget of at least one whole sequence (vLLM refuses less with chunking off) and never below the CPU
default of 4,096; the sequence length from max_model_len, else the model's context (its config.json). The real vLLM's
side: tests/vllm_real/test_vllm_cpu_prefill.py."""

import json

from seedfast.rollout.vllm_engine import whole_prefills


def test_short_sequences_keep_the_cpu_default_budget(tmp_path):
    assert whole_prefills(str(tmp_path), 256) == {"enable_chunked_prefill": False, "max_num_batched_tokens": 4096}


def test_a_long_sequence_gets_a_step_of_its_own_length(tmp_path):
    assert whole_prefills(str(tmp_path), 8192)["max_num_batched_tokens"] == 8192


def test_without_max_model_len_the_models_context_decides(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    assert whole_prefills(str(tmp_path), None) == {"enable_chunked_prefill": False, "max_num_batched_tokens": 8192}
