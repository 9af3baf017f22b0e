"""The weights pushed to a colocated rollout engine (distributed/weight_push.py): on 2 gloo ranks with an FSDP2-sharded
(and a tensor-parallel) tiny Decoder every rank gets exactly the one-process HF state dict, bucket by bucket,
with one bucket alive at a time."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

from seedfast.config import ConfigError
from seedfast.distributed.mesh import MESH_DIMS
from seedfast.distributed.parallelize import apply_fsdp, parallelize_decoder
from seedfast.distributed.weight_push import buckets, check_colocated, hf_named_tensors
from seedfast.model import load_hf
from seedfast.model.decoder import build_decoder
from tests.distributed.dist_helpers import make_config, run_on_ranks


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _check_pushed(model, reference, bucket_bytes):
    expected = reference.state_dict()
    pushed = []
    for bucket in buckets(hf_named_tensors(model), bucket_bytes):
        assert bucket
        size = sum(_nbytes(t) for _, t in bucket)
        assert size <= bucket_bytes or len(bucket) == 1, [n for n, _ in bucket]
        pushed += [(n, t.clone()) for n, t in bucket]
    assert [n for n, _ in pushed] == list(expected)  # the HF export's names, in order, each once
    for name, tensor in pushed:
        assert not hasattr(tensor, "full_tensor"), name  # plain tensors, not DTensors
        assert torch.equal(tensor, expected[name]), name


def _fsdp_worker(rank, world, family):
    model = build_decoder(make_config(family), dtype=torch.float32, seed=3)
    reference = build_decoder(make_config(family), dtype=torch.float32, seed=3)
    apply_fsdp(model, init_device_mesh("cpu", (world,)))
    assert any(hasattr(p, "full_tensor") for p in model.parameters())
    embed = reference.state_dict()["model.embed_tokens.weight"]
    for bucket_bytes in (1, _nbytes(embed) + 1, 1 << 30):  # one tensor per bucket, several, all in one
        _check_pushed(model, reference, bucket_bytes)
    if family == "qwen2":  # tied: no separate LM head
        assert "lm_head.weight" not in dict(hf_named_tensors(model))
    cast = dict(hf_named_tensors(model, dtype=torch.bfloat16))
    assert cast["model.norm.weight"].dtype == torch.bfloat16
    assert torch.equal(cast["model.norm.weight"], reference.model.norm.weight.to(torch.bfloat16))


def _tp_worker(rank, world):
    cfg = make_config("qwen3", vocab_size=202)  # untied LM head, q/k norms; 2 key-value heads split over tp=2
    model = build_decoder(cfg, dtype=torch.float32, seed=4)
    reference = build_decoder(cfg, dtype=torch.float32, seed=4)
    parallelize_decoder(model, init_device_mesh("cpu", (1, 2), mesh_dim_names=MESH_DIMS))
    _check_pushed(model, reference, 20_000)
    assert "lm_head.weight" in dict(hf_named_tensors(model))


def _colocated_worker(rank, world, folder):
    """The RL loop's sync on every rank: its own (fake) vLLM engine, fed by the rank's gathers of the sharded policy."""
    from seedfast.rollout import vllm_engine
    from seedfast.rollout.colocated import build_rollout
    from seedfast.rollout.own_engine import Sampler
    from seedfast.sampling_params import SamplingParams
    from tests.rollout.fake_vllm import fake_module, prompts, update

    vllm_engine._require_vllm = fake_module
    policy = load_hf(folder, dtype=torch.float32, attn_backend="sdpa")
    reference = load_hf(folder, dtype=torch.float32, attn_backend="sdpa")
    apply_fsdp(policy, init_device_mesh("cpu", (world,)))
    rollout = build_rollout("vllm", policy, folder, dtype="fp32", seed=0)
    for step in range(2):
        update(reference, 10 + step)  # the update, on the sharded policy and on a one-process copy
        with torch.no_grad():
            for p, r in zip(policy.parameters(), reference.parameters()):
                p.copy_(torch.distributed.tensor.distribute_tensor(r, p.device_mesh, p.placements))
        rollout.begin_step(step)
        metrics = rollout.before_rollout(buckets(hf_named_tensors(policy), 8192))
        assert metrics["sync/buckets"] > 1
        theirs = rollout.llm.decoder.state_dict()
        assert all(torch.equal(theirs[n], t) for n, t in reference.state_dict().items())
        got = rollout.generate(prompts(), SamplingParams(5, temperature=0.0))
        assert got == Sampler(reference).generate(prompts(), SamplingParams(5, temperature=0.0))
        rollout.after_rollout()


def test_every_rank_syncs_its_own_colocated_engine(tmp_path):
    from seedfast.model import save_hf

    folder = save_hf(build_decoder(make_config("qwen2", vocab_size=97), dtype=torch.float32, seed=2), tmp_path / "hf")
    run_on_ranks(2, _colocated_worker, str(folder))


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_fsdp2_sharded_push_equals_the_one_process_state_dict(family):
    run_on_ranks(2, _fsdp_worker, family)


def test_tensor_parallel_push_equals_the_one_process_state_dict():
    run_on_ranks(2, _tp_worker)


class _Counting:
    """(name, tensor) pairs whose tensors are tracked with weakrefs: how many are alive when each is made."""

    def __init__(self, model):
        self.source = hf_named_tensors(model)
        self.refs: list[weakref.ref] = []
        self.alive_at_gather: list[int] = []

    def __iter__(self):
        return self

    def peek_nbytes(self):
        return self.source.peek_nbytes()

    def __next__(self):
        name, tensor = next(self.source)
        tensor = tensor.clone()  # a fresh tensor, as a gather makes
        gc.collect()
        self.alive_at_gather.append(sum(r() is not None for r in self.refs))
        self.refs.append(weakref.ref(tensor))
        return name, tensor


def _use(bucket):
    for _, t in bucket:  # the consumer's loop variable keeps the list (not its tensors) until the next bucket
        t.add_(0)
    return len(bucket)


@pytest.mark.parametrize("peek", [True, False])
def test_at_most_one_bucket_is_alive(peek):
    model = build_decoder(make_config("qwen3"), dtype=torch.float32, seed=1)
    source = _Counting(model)
    # without peek_nbytes (a plain iterable) the tensor that does not fit is gathered beside the full bucket
    sizes = [_use(b) for b in buckets(source if peek else iter(source.__next__, None), 30_000)]
    assert len(sizes) > 3 and max(sizes) > 1
    start, previous = 0, 0
    for n in sizes:
        for k in range(start, start + n):
            # alive when tensor k is gathered: the ones before it in its own bucket, never the earlier bucket's
            # (but for the first of a bucket without peeking: the full bucket it did not fit in)
            bound = previous if (k == start and not peek) else k - start
            assert source.alive_at_gather[k] <= bound, (k, source.alive_at_gather, sizes)
        start, previous = start + n, n


def test_buckets_respect_the_limit_and_keep_big_tensors_alone():
    items = [(f"t{i}", torch.zeros(n)) for i, n in enumerate([10, 10, 100, 5, 5, 5, 30])]  # fp32: 4 bytes each
    got = [[name for name, _ in b] for b in buckets(iter(items), 80)]
    assert got == [["t0", "t1"], ["t2"], ["t3", "t4", "t5"], ["t6"]]
    with pytest.raises(ValueError, match="bucket_bytes"):
        next(buckets(iter(items), 0))


def test_check_colocated_refuses_tensor_parallel_rollout_with_several_ranks():
    check_colocated(1, 4)
    check_colocated(8, 1)
    with pytest.raises(ConfigError, match=r"rollout\.tensor_parallel=2"):
        check_colocated(2, 2)
