"""The weight push into the REAL vLLM (its CPU back end, `make test-vllm`): after a push, what vLLM computes with is
the trainer's new weights. The CPU back end computes every linear layer with a copy it repacks after loading (the
parameter itself is emptied) and the LM head with a packed copy of its weight, so `load_weights` alone either fails or,
for a tied head, leaves the copy the logits come from stale. Checked here against what vLLM actually computes: greedy
tokens and their log-probs after a push equal the own sampler's (rollout/own_engine.py) on the new weights, for an
untied (qwen3) and a tied (qwen2) head, push after push; and a push that leaves the tied head's packed copy stale
fails the checksum verify. The engine runs as in production: its core in another process, every bucket through
vLLM's message serializer. Skipped without vllm."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from seedfast.distributed.weight_push import buckets, hf_named_tensors  # noqa: E402
from seedfast.rollout.own_engine import Sampler  # noqa: E402
from seedfast.sampling_params import SamplingParams  # noqa: E402
from tests.vllm_real.vllm_helpers import make_engine, prompts, tiny_policy, update  # noqa: E402

NEW_TOKENS = 8


@pytest.fixture(scope="module", params=["qwen3", "qwen2"])
def setup(request, tmp_path_factory):
    """(policy, engine) per family: one engine each for the module (their start is most of the time here), shut
    down after the family's tests: left to the interpreter's exit, vLLM logs into pytest's closed output streams."""
    folder = tmp_path_factory.mktemp(f"vllm_{request.param}")
    policy = tiny_policy(request.param, folder)
    engine = make_engine(folder)
    yield policy, engine
    engine.close()


def _same_as_own(engine, policy) -> list[float]:
    """vLLM's greedy completions equal the own sampler's on `policy`, tokens and log-probs; returns the log-probs."""
    ours = Sampler(policy).generate_full(prompts(), SamplingParams(NEW_TOKENS, temperature=0.0))
    theirs = engine.generate_full(prompts(), SamplingParams(NEW_TOKENS, temperature=0.0))
    for a, b in zip(ours, theirs):
        assert b.token_ids == a.token_ids
        assert b.logprobs is not None and len(b.logprobs) == len(b.token_ids)
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-3, rtol=0)
    return [lp for g in theirs for lp in g.logprobs]


def test_loaded_engine_computes_what_the_own_sampler_does(setup):
    policy, engine = setup
    _same_as_own(engine, policy)


def test_push_after_push_takes_effect_in_what_vllm_computes(setup):
    policy, engine = setup
    before = _same_as_own(engine, policy)
    for step in range(2):
        update(policy, 100 + step)
        stats = engine.push_weights(buckets(hf_named_tensors(policy), 64 << 10))  # verifies the checksums
        assert stats["buckets"] > 1 and stats["tensors"] == len(list(hf_named_tensors(policy)))
        after = _same_as_own(engine, policy)
        # what a stale engine would still compute is off by far more than the 1e-3 the comparison allows
        assert len(after) != len(before) or max(abs(a - b) for a, b in zip(after, before)) > 0.05
        before = after


def test_a_stale_packed_lm_head_fails_the_verify(setup):
    """The push without the last step (the tied head's packed copy made again): vLLM's embedding holds the new
    weights, its logits still come from the old copy; the probe of what the head computes with names it."""
    policy, engine = setup
    if not policy.config.tie_word_embeddings:
        pytest.skip("the tied head's case")
    update(policy, 7)
    expected: dict = {}
    engine.llm.collective_rpc("seedfast_begin_reload")
    for bucket in buckets(hf_named_tensors(policy), 64 << 10):
        engine._push_bucket(bucket, expected)
    engine.llm.collective_rpc("seedfast_end_reload", args=(False,))  # no repack of the vocabulary layers
    engine.llm.reset_prefix_cache()
    with pytest.raises(RuntimeError, match=r"model\.embed_tokens\.weight#probe sums to"):
        engine._verify(expected)
    stale = engine.generate_full(prompts(), SamplingParams(NEW_TOKENS, temperature=0.0))  # the logits of the old head
    fresh = Sampler(policy).generate_full(prompts(), SamplingParams(NEW_TOKENS, temperature=0.0))
    assert any(a.token_ids != b.token_ids or max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) > 0.05
               for a, b in zip(stale, fresh))
    engine.push_weights(buckets(hf_named_tensors(policy), 64 << 10))  # a whole push puts it right
    _same_as_own(engine, policy)
