"""The RL loop's rollout engines (rollout/colocated.py). On the CPU a fake `vllm` module stands in for vLLM: its
LLM loads the HF folder into its own model copy, runs the real worker extension (WeightSyncExtension) for the
weight push, generates with the own Sampler over its copy, and records sleep / wake_up / collective_rpc /
reset_prefix_cache. A real vLLM engine is checked by the gpu test at the end."""

from __future__ import annotations

import inspect

import pytest
import torch

from seedfast.config import ConfigError
from seedfast.distributed.weight_push import buckets, check_colocated, hf_named_tensors
from seedfast.model import DecoderConfig, build_decoder, save_hf
from seedfast.rollout.colocated import OwnRollout, RolloutEngine, VLLMRollout, build_rollout
from seedfast.rollout.engine import GenerationEngine
from seedfast.rollout.own_engine import Sampler
from seedfast.rollout.vllm_engine import VLLMEngine
from seedfast.sampling_params import SamplingParams
from seedfast.seeds import request_seed
from tests.rollout.fake_vllm import install_fake_vllm, prompts, update

VOCAB = 97  # fake_vllm.prompts' default vocabulary


def tiny_config(**overrides) -> DecoderConfig:
    base = dict(model_type="qwen2", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    base.update(overrides)
    return DecoderConfig(**base)


@pytest.fixture
def fake_vllm(monkeypatch):
    return install_fake_vllm(monkeypatch)


@pytest.fixture
def policy_and_folder(tmp_path):
    torch.manual_seed(0)
    policy = build_decoder(tiny_config(), dtype=torch.float32, attn_backend="sdpa", seed=0)
    folder = save_hf(policy, tmp_path / "hf")
    return policy, folder


def push(policy, bucket_bytes=4096):
    return buckets(hf_named_tensors(policy), bucket_bytes)


def weights_equal(llm, policy) -> bool:
    theirs = llm.decoder.state_dict()
    return all(torch.equal(theirs[n], t) for n, t in policy.state_dict().items())


# ---------------------------------------------------------------- VLLMRollout over the fake


def test_sync_order_wake_weights_push_wake_kv_generate_sleep(fake_vllm, policy_and_folder):
    policy, folder = policy_and_folder
    rollout = build_rollout("vllm", policy, folder, seed=0, dtype="fp32", sleep=True)
    assert isinstance(rollout, VLLMRollout) and not rollout.reads_policy
    llm = rollout.llm
    assert llm.sleep_mode

    for step in range(2):
        rollout.begin_step(100 + step)
        llm.calls.clear()
        metrics = rollout.before_rollout(push(policy))
        assert weights_equal(llm, policy)
        rollout.generate(prompts(), SamplingParams(4, temperature=0.0))
        metrics |= rollout.after_rollout()
        n_buckets = int(metrics["sync/buckets"])
        pushes = [("rpc", "seedfast_load_weights")] * n_buckets
        synced = [*pushes, ("reset_prefix_cache",), ("rpc", "seedfast_weight_sums")]
        woken = [("wake_up", ("weights",)), *synced, ("wake_up", ("kv_cache",))] if step else synced
        assert llm.calls == [*woken, ("generate", 3), ("sleep", 1)]
        assert n_buckets > 1
        assert metrics["sync/bytes"] == sum(t.numel() * 4 for t in policy.state_dict().values())
        assert metrics["sync/tensors"] == len(policy.state_dict())
        for key in ("sync/seconds", "sync/push_seconds", "sync/wake_seconds", "sync/sleep_seconds"):
            assert metrics[key] >= 0.0, key
        update(policy, step)
        assert not weights_equal(llm, policy)
    with pytest.raises(RuntimeError, match="asleep"):
        rollout.generate(prompts(), SamplingParams(2))


def test_sleep_level_2_discards_weights_and_the_push_restores_every_one(fake_vllm, policy_and_folder):
    policy, folder = policy_and_folder
    rollout = build_rollout("vllm", policy, folder, dtype="fp32", sleep_level=2)
    rollout.before_rollout(push(policy))
    rollout.after_rollout()
    assert torch.isnan(rollout.llm.decoder.model.norm.weight).all()
    update(policy, 5)
    rollout.before_rollout(push(policy))
    assert weights_equal(rollout.llm, policy)


def test_without_sleep_the_engine_stays_awake(fake_vllm, policy_and_folder):
    policy, folder = policy_and_folder
    rollout = build_rollout("vllm", policy, folder, dtype="fp32", sleep=False)
    assert not rollout.llm.sleep_mode
    rollout.before_rollout(push(policy))
    assert rollout.after_rollout() == {}
    rollout.generate(prompts(), SamplingParams(2))
    assert not any(c[0] in ("sleep", "wake_up") for c in rollout.llm.calls)


@pytest.mark.parametrize("change", ["update", "one_element"])
def test_a_push_that_silently_drops_a_tensor_fails_the_verify_naming_it(fake_vllm, policy_and_folder, change):
    policy, folder = policy_and_folder
    rollout = build_rollout("vllm", policy, folder, dtype="fp32")
    dropped = "model.layers.1.post_attention_layernorm.weight"
    rollout.llm.worker.model_runner.model.drop = dropped
    if change == "update":
        update(policy, 1)
    else:  # the smallest change: one element by about a bf16 step
        with torch.no_grad():
            policy.get_parameter(dropped)[3] += 2**-8
    with pytest.raises(RuntimeError, match=rf"{dropped.replace('.', '[.]')} sums to"):
        rollout.before_rollout(push(policy))


def test_fp32_weights_into_a_bf16_engine_verify_exactly(fake_vllm, policy_and_folder):
    """The checksum is taken on the tensor as the engine holds it (cast to its dtype)."""
    policy, folder = policy_and_folder
    rollout = build_rollout("vllm", policy, folder, dtype="bf16")
    assert rollout.llm.decoder.model.norm.weight.dtype == torch.bfloat16
    update(policy, 2)
    rollout.before_rollout(push(policy))
    theirs = rollout.llm.decoder.state_dict()
    assert all(torch.equal(theirs[n], t.to(torch.bfloat16)) for n, t in policy.state_dict().items())


def test_under_torchrun_vllm_runs_in_the_rank_and_gets_the_tensors_themselves(fake_vllm, policy_and_folder,
                                                                              monkeypatch):
    policy, folder = policy_and_folder
    monkeypatch.setenv("WORLD_SIZE", "2")
    rollout = build_rollout("vllm", policy, folder, dtype="fp32")
    assert rollout.llm.kwargs["distributed_executor_backend"] == "external_launcher"
    # each rank's engine is one of vLLM's data-parallel replicas: torchrun's world = tp x pp x dp for vLLM
    assert rollout.llm.kwargs["data_parallel_size"] == 2
    assert rollout.engine.in_process
    seen = []
    load = rollout.llm.worker.seedfast_load_weights
    rollout.llm.worker.seedfast_load_weights = lambda chunk: seen.extend(k for _, (k, _) in chunk) or load(chunk)
    update(policy, 4)
    rollout.before_rollout(push(policy))
    assert set(seen) == {"tensor"} and weights_equal(rollout.llm, policy)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert build_rollout("vllm", policy, folder, dtype="fp32").llm.kwargs.get("distributed_executor_backend") is None


def test_a_worker_that_loads_fewer_tensors_than_sent_fails(fake_vllm, policy_and_folder):
    policy, folder = policy_and_folder
    rollout = build_rollout("vllm", policy, folder, dtype="fp32")
    load = rollout.llm.worker.seedfast_load_weights
    rollout.llm.worker.seedfast_load_weights = lambda chunk: load(chunk[1:])
    with pytest.raises(RuntimeError, match="loaded 0 of 1 tensors"):
        rollout.before_rollout(push(policy, bucket_bytes=1))


def test_stale_weights_change_generations_and_a_sync_makes_them_identical(fake_vllm, policy_and_folder):
    """The copy engine (the fake's own model, fed only by the buckets) against the own sampler on the live policy:
    skipping a sync after an update is visible in greedy tokens; a sync makes them identical."""
    policy, folder = policy_and_folder
    copy = build_rollout("vllm", policy, folder, dtype="fp32", sleep=False)
    live = build_rollout("own", policy)
    assert isinstance(live, OwnRollout) and live.reads_policy
    copy.before_rollout(push(policy))
    greedy = SamplingParams(6, temperature=0.0)
    assert copy.generate(prompts(), greedy) == live.generate(prompts(), greedy)

    update(policy, 3)
    stale = copy.generate(prompts(), SamplingParams(6, temperature=0.0))  # no sync
    fresh = live.generate(prompts(), SamplingParams(6, temperature=0.0))
    assert stale != fresh
    copy.before_rollout(push(policy))
    synced = copy.generate_full(prompts(), SamplingParams(6, temperature=0.0))
    assert [g.token_ids for g in synced] == fresh
    ours = live.generate_full(prompts(), SamplingParams(6, temperature=0.0))
    for a, b in zip(synced, ours):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs))


def test_request_seeds_come_from_the_step_and_differ_across_copies(fake_vllm, policy_and_folder):
    policy, folder = policy_and_folder
    rollout = build_rollout("vllm", policy, folder, dtype="fp32", sleep=False)
    rollout.before_rollout(push(policy))
    group = [prompts()[0]] * 4  # a GRPO group: copies of one prompt

    def step(seed):
        rollout.begin_step(seed)
        params = SamplingParams(8, temperature=1.0)
        return rollout.generate(group, params), rollout.generate(group, params)

    first, second = step(7)
    assert len({tuple(g) for g in first}) > 1  # copies differ
    assert first != second  # the second call of a step draws anew
    assert step(7) == (first, second)  # a resumed run (same step seed) draws the same
    assert step(8)[0] != first
    assert request_seed(7, 0, 0) != request_seed(7, 0, 1) != request_seed(7, 1, 0)
    rollout.seed_requests = False  # the engine's own generator: no per-request seeds sent
    rollout.begin_step(7)
    calls = []
    rollout.engine.generate_full = lambda *args, seeds=None: calls.append(seeds) or []
    rollout.generate(group, SamplingParams(8))
    assert calls == [None]
    assert all(0 <= request_seed(s, c, i) < 2**31 - 1 for s in (0, 2**31 - 2) for c in (0, 9) for i in (0, 999))


@pytest.mark.parametrize("engine", [Sampler, VLLMEngine, OwnRollout, VLLMRollout, GenerationEngine, RolloutEngine])
def test_every_engine_takes_the_protocol_sampling_params(engine):
    """The engine protocol (rollout/engine.py, and RolloutEngine) and every engine take the prompts and one
    SamplingParams (the seed among them) on generate and generate_full; vLLM's per-request `seeds` only as a
    keyword."""
    for method in ("generate", "generate_full"):
        params = list(inspect.signature(getattr(engine, method)).parameters.values())
        assert [p.name for p in params[:3]] == ["self", "prompt_token_lists", "params"], f"{engine.__name__}.{method}"
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[3:]), f"{engine.__name__}.{method}"


def test_a_seeded_call_draws_as_the_first_call_after_seeding(fake_vllm, policy_and_folder):
    """generate(..., seed=s) is a function of s alone: the first call after begin_step(s) (own and vLLM rollouts),
    or of an engine built with seed s (the own Sampler); the engine's own stream plays no part."""
    policy, folder = policy_and_folder
    group = [prompts()[0]] * 3
    vllm = build_rollout("vllm", policy, folder, dtype="fp32", sleep=False)
    vllm.before_rollout(push(policy))
    for rollout in (OwnRollout(policy, seed=0), vllm):
        rollout.begin_step(5)
        first = rollout.generate(group, SamplingParams(8, temperature=1.0))
        rollout.begin_step(9)
        rollout.generate(group, SamplingParams(8, temperature=1.0))  # the stream moves on
        assert rollout.generate(group, SamplingParams(8, temperature=1.0, seed=5)) == first
        assert [g.token_ids for g in rollout.generate_full(group, SamplingParams(8, temperature=1.0, seed=5))] == first
        assert rollout.generate(group, SamplingParams(8, temperature=1.0, seed=6)) != first
    sampler = Sampler(policy, seed=1)
    sampler.generate(group, SamplingParams(8, temperature=1.0))
    assert sampler.generate(group, SamplingParams(8, temperature=1.0, seed=5)) == Sampler(policy, seed=5).generate(
        group, SamplingParams(8, temperature=1.0))
    with pytest.raises(ValueError, match="not both"):
        vllm.engine.generate(group, SamplingParams(8, seed=5), seeds=[1, 2, 3])


# ---------------------------------------------------------------- OwnRollout and the checks


def test_own_rollout_reads_the_live_weights_and_never_reads_the_buckets():
    policy = build_decoder(tiny_config(), dtype=torch.float32, attn_backend="sdpa", seed=1)
    rollout = build_rollout("own", policy, seed=3)

    def untouchable():
        raise AssertionError("the own engine must not gather the weights")
        yield

    rollout.begin_step(11)
    assert rollout.before_rollout(untouchable()) == {}
    got = rollout.generate_full(prompts(), SamplingParams(5, temperature=1.0))
    assert rollout.after_rollout() == {}
    # what the trainer does per step
    want = Sampler(policy, seed=11).generate_full(prompts(), SamplingParams(5, temperature=1.0))
    assert got == want


def test_build_rollout_checks_its_arguments(policy_and_folder):
    policy, _ = policy_and_folder
    with pytest.raises(ValueError, match="engine must be"):
        build_rollout("sglang", policy)
    with pytest.raises(ValueError, match="HF folder"):
        build_rollout("vllm", policy)
    with pytest.raises(ValueError, match="sleep_level"):
        VLLMRollout(object(), sleep_level=3)


def test_check_colocated_names_the_key():
    check_colocated(1, 2)
    with pytest.raises(ConfigError, match=r"rollout\.tensor_parallel"):
        check_colocated(4, 2)


# ---------------------------------------------------------------- a real vLLM engine (GPU)


@pytest.mark.gpu
def test_real_vllm_rollout_generates_syncs_and_verifies(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("vllm")
    cfg = DecoderConfig(model_type="qwen2", vocab_size=512, hidden_size=256, intermediate_size=512,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                        tie_word_embeddings=True, max_position_embeddings=1024)
    policy = build_decoder(cfg, dtype=torch.float32, device="cuda", attn_backend="sdpa", seed=0)
    with torch.no_grad():
        policy.model.embed_tokens.weight.mul_(20.0)  # peaked distributions: bf16 rounding cannot flip argmax
    policy = policy.to(torch.bfloat16)
    folder = save_hf(policy, tmp_path / "hf")
    rollout = build_rollout("vllm", policy, folder, dtype="bf16", gpu_memory_utilization=0.2, max_model_len=256,
                            enforce_eager=True)
    want = lambda: Sampler(policy).generate(prompts(), SamplingParams(4, temperature=0.0))  # noqa: E731
    rollout.begin_step(0)
    metrics = rollout.before_rollout(push(policy, 1 << 20))  # verifies checksums
    assert metrics["sync/buckets"] > 1
    before = rollout.generate(prompts(), SamplingParams(4, temperature=0.0))
    assert [b[:2] for b in before] == [w[:2] for w in want()]
    assert "sync/sleep_seconds" in rollout.after_rollout()

    with torch.no_grad():
        perm = torch.randperm(512, generator=torch.Generator().manual_seed(1)).to("cuda")
        policy.model.embed_tokens.weight.copy_(policy.model.embed_tokens.weight[perm])
        policy.model.norm.weight.mul_(1.5)
    rollout.begin_step(1)
    rollout.before_rollout(push(policy, 1 << 20))  # wakes weights, pushes, verifies, wakes the KV cache
    after = rollout.generate(prompts(), SamplingParams(4, temperature=0.0))
    assert after != before
    assert [a[:2] for a in after] == [w[:2] for w in want()]
    sampled = rollout.generate([prompts()[0]] * 4, SamplingParams(8, temperature=1.0))
    assert len({tuple(s) for s in sampled}) > 1  # per-request seeds differ across copies of one prompt
    rollout.after_rollout()
