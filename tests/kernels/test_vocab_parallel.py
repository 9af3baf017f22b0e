"""Vocabulary-parallel log-probs: 2 CPU processes over gloo against the unsharded fp64 reference."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from seedfast.ops.vocab_parallel import shard_range, vocab_parallel_logprob
from tests.kernels.triton_reference import assert_close, reference_grads, reference_logprob

N, D, V = 29, 16, 37  # shards of 19 and 18 rows
CASES = [
    dict(dtype=torch.float32, with_entropy=True, teacher=True, backend="torch", tol=1e-5),
    dict(dtype=torch.bfloat16, with_entropy=False, teacher=False, backend="torch", tol=1e-2),
    # Any backend's math works under the sharding: the Triton kernels (interpreted on CPU).
    dict(dtype=torch.float32, with_entropy=True, teacher=False, backend="triton", tol=1e-5),
]


def _run_case(rank, world, dtype, with_entropy, teacher, backend, tol):
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(N, D, generator=g).to(dtype)
    weight = (torch.randn(V, D, generator=g) * 0.7).to(dtype)
    teacher_hidden = torch.randn(N, D, generator=g).to(dtype) if teacher else None
    targets = torch.randint(0, V, (N,), generator=g)
    targets[:4] = torch.tensor([0, 19, -100, V - 1])  # column 0 of each shard, an ignored row, the last id
    grad_logprob, grad_entropy = torch.randn(N, generator=g), torch.randn(N, generator=g)
    start, stop = shard_range(V, rank, world)

    h = hidden.clone().requires_grad_()
    w_shard = weight[start:stop].clone().requires_grad_()
    out = vocab_parallel_logprob(h, w_shard, targets, start, teacher_hidden=teacher_hidden, temperature=0.8,
                                 with_entropy=with_entropy, backend=backend)
    loss = (out.logprob * grad_logprob).sum()
    if with_entropy:
        loss = loss + (out.entropy * grad_entropy).sum()
    loss.backward()

    ref_lp, ref_ent, ref_teacher, _ = reference_logprob(hidden, weight, targets, teacher_hidden, 0.8)
    ref_h, ref_w = reference_grads(hidden, weight, targets, grad_logprob, grad_entropy if with_entropy else None,
                                   0.8)
    what = f"rank {rank} {dtype} {backend}"
    assert_close(out.logprob.detach(), ref_lp, tol, f"{what} logprob")
    if with_entropy:
        assert_close(out.entropy.detach(), ref_ent, tol, f"{what} entropy")
    if teacher:
        assert not out.teacher_logprob.requires_grad
        assert_close(out.teacher_logprob, ref_teacher, tol, f"{what} teacher_logprob")
    assert_close(h.grad, ref_h, tol, f"{what} grad hidden")
    assert_close(w_shard.grad, ref_w[start:stop], tol, f"{what} grad weight shard")


def _check_dtensor_rejected(world):
    # FSDP2 shards weights as DTensors; their data_ptr() is not the local shard: refuse them
    # (docs/pitfalls.md, 'Sharded weights (DTensor) in a kernel').
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from seedfast.ops import triton_backend

    weight = distribute_tensor(torch.randn(V, D), init_device_mesh("cpu", (world,)), [Shard(0)])
    hidden, targets = torch.randn(N, D), torch.zeros(N, dtype=torch.long)
    with pytest.raises(TypeError, match="DTensor"):
        vocab_parallel_logprob(hidden, weight, targets, 0)
    with pytest.raises(TypeError, match="DTensor"):
        triton_backend.forward(hidden, weight, targets, None, 1.0, False, -100)


def _worker(rank, world, port, cases):
    if os.environ.get("TRITON_INTERPRET") == "1":  # a spawned process: conftest's interpreter patches are not here
        from seedfast.kernels.interpreter_patches import patch_interpreter

        patch_interpreter()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        for case in cases:
            _run_case(rank, world, **case)
        _check_dtensor_rejected(world)
        dist.barrier()  # no rank tears gloo down while a peer still uses it (tests/distributed/dist_helpers.py)
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_match_unsharded_reference():
    cases = [c for c in CASES if c["backend"] != "triton" or os.environ.get("TRITON_INTERPRET") == "1"]
    mp.spawn(_worker, args=(2, _free_port(), cases), nprocs=2, join=True)


def test_shard_range_covers_vocab_once():
    for vocab, world in [(37, 2), (10, 3), (5, 5), (152064, 8)]:
        ranges = [shard_range(vocab, r, world) for r in range(world)]
        assert ranges[0][0] == 0 and ranges[-1][1] == vocab
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        assert max(b - a for a, b in ranges) - min(b - a for a, b in ranges) <= 1


def test_needs_a_process_group():
    if dist.is_initialized():
        pytest.skip("a process group exists in this process")
    with pytest.raises(ValueError, match="process group"):
        vocab_parallel_logprob(torch.randn(2, 4), torch.randn(3, 4), torch.zeros(2, dtype=torch.long), 0)
