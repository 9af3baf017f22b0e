"""The RL loop's sync with an FSDP2-sharded policy on 2 gloo ranks, each with its own REAL vLLM engine (the CPU back
end, `make test-vllm`) inside the rank's process, as build_rollout sets it up under torchrun (vLLM's
external_launcher, its data-parallel replicas over the ranks). Each rank gathers the sharded policy bucket by bucket
into its engine (the tensors themselves: same process; layerwise reload; checksum and probe verify), and what every
engine then computes, greedy tokens and their log-probs, is the own sampler's on the full updated weights, push
after push. Skipped without vllm."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from seedfast.distributed.parallelize import apply_fsdp  # noqa: E402
from seedfast.distributed.weight_push import buckets, hf_named_tensors  # noqa: E402
from seedfast.model import load_hf  # noqa: E402
from seedfast.rollout.own_engine import Sampler  # noqa: E402
from seedfast.sampling_params import SamplingParams  # noqa: E402
from tests.distributed.dist_helpers import run_on_ranks  # noqa: E402
from tests.vllm_real.vllm_helpers import engine_env, prompts, tiny_policy, update  # noqa: E402

NEW_TOKENS = 6


def _load_sharded(folder: str, world: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the policy sharded by FSDP2 over the ranks, a one-process copy of it)."""
    from torch.distributed.device_mesh import init_device_mesh

    policy = load_hf(folder, dtype=torch.float32, attn_backend="sdpa")
    reference = load_hf(folder, dtype=torch.float32, attn_backend="sdpa")
    apply_fsdp(policy, init_device_mesh("cpu", (world,)))
    assert any(hasattr(p, "full_tensor") for p in policy.parameters())
    return policy, reference


def _update_both(policy: torch.nn.Module, reference: torch.nn.Module, seed: int) -> None:
    """The update on the one-process copy, its result put into the sharded policy's shards."""
    from torch.distributed.tensor import distribute_tensor

    update(reference, seed)
    with torch.no_grad():
        for p, r in zip(policy.parameters(), reference.parameters()):
            p.copy_(distribute_tensor(r, p.device_mesh, p.placements))


def _worker(rank: int, world: int, folder: str) -> None:
    from seedfast.rollout.colocated import build_rollout

    engine_env()
    policy, reference = _load_sharded(folder, world)
    rollout = build_rollout("vllm", policy, folder, dtype="fp32", seed=0, enforce_eager=True, max_num_seqs=8,
                            max_model_len=256)
    assert rollout.engine.in_process and rollout.engine.layerwise
    stale = Sampler(reference).generate_full(prompts(), SamplingParams(NEW_TOKENS, temperature=0.0))  # what vLLM loaded
    for step in range(2):
        _update_both(policy, reference, 10 + step)
        rollout.begin_step(step)
        metrics = rollout.before_rollout(buckets(hf_named_tensors(policy), 64 << 10))  # verifies
        assert metrics["sync/buckets"] > 1
        ours = Sampler(reference).generate_full(prompts(), SamplingParams(NEW_TOKENS, temperature=0.0))
        theirs = rollout.generate_full(prompts(), SamplingParams(NEW_TOKENS, temperature=0.0))
        for a, b in zip(ours, theirs):
            assert b.token_ids == a.token_ids, (rank, step)
            torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-3, rtol=0)
        # an engine that kept the previous weights would be off by far more than the 1e-3 allowed
        assert any(a.token_ids != b.token_ids or max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) > 0.05
                   for a, b in zip(ours, stale))
        stale = ours
        rollout.after_rollout()
    _shutdown(rollout)


def _shutdown(rollout) -> None:
    """The engine shut down while the ranks' process group, which it tears down with its own, is still up (every
    rank past its last collective first); left to the interpreter's exit, its teardown finds the group gone."""
    torch.distributed.barrier()
    rollout.close()


def test_every_rank_pushes_its_fsdp2_shards_into_its_own_real_vllm(tmp_path):
    tiny_policy("qwen3", tmp_path / "hf")
    run_on_ranks(2, _worker, str(tmp_path / "hf"))
