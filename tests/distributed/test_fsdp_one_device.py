"""FSDP2 on a 1-rank mesh, in this process: one SEED (and one GRPO) update equals the plain single-process update
(loss, gradient norm, metrics, every updated weight). On CPU (gloo) it runs everywhere; on CUDA (nccl, one GPU) it
is the GPU window's FSDP2 check (benchmarks/gpu_check.sh). FSDP2's own code runs (the units, the all-gather and
reduce-scatter on one rank, the DTensor parameters and their optimizer state, the mixed-in hooks around the fused
log-prob ops), so the sharded update path is checked on a GPU without a second GPU; the world-size conventions
need 2 ranks (tests/distributed/test_fsdp_update.py, docs/scaling.md)."""

from __future__ import annotations

import copy
import socket

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from seedfast.distributed.data import DataParallel
from seedfast.distributed.parallelize import apply_fsdp, fsdp_modules
from seedfast.model.decoder import build_decoder
from tests.distributed.dist_helpers import grouped_samples, make_config
from tests.distributed.test_fsdp_update import CASES, _full, _update

CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
DEVICES = [pytest.param("cpu", id="cpu-gloo"), pytest.param("cuda", id="cuda-nccl", marks=CUDA)]
# CUDA: the Triton kernels' backward accumulates in a non-deterministic order; the CPU path is bit-for-bit
TOL = {"cpu": 1e-5, "cuda": 1e-4}


@pytest.fixture
def one_rank_group(request):
    device = request.param
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert not dist.is_initialized()
    if device == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=0, world_size=1)
    try:
        yield device
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("one_rank_group", DEVICES, indirect=True)
@pytest.mark.parametrize("name", ["seed", "grpo"])
def test_fsdp2_on_one_rank_equals_the_plain_update(one_rank_group, name):
    device, case, tol = one_rank_group, CASES[name], TOL[one_rank_group]
    start = build_decoder(make_config("qwen2"), dtype=torch.float32, seed=3).to(device)
    samples = grouped_samples(5, 12)
    ref_model = copy.deepcopy(start)
    ref_loss, ref_metrics, ref_norm, ref_grads = _update(ref_model, samples, case)

    model = copy.deepcopy(start)
    apply_fsdp(model, init_device_mesh(device, (1,)))
    assert len(fsdp_modules(model)) == len(model.model.layers) + 1
    loss, metrics, norm, grads = _update(model, samples, case, dp=DataParallel(0, 1))

    assert loss == pytest.approx(ref_loss, rel=tol, abs=tol / 100)
    assert norm == pytest.approx(ref_norm, rel=tol)
    assert metrics.keys() == ref_metrics.keys()
    for k, v in ref_metrics.items():
        assert metrics[k] == pytest.approx(v, rel=tol, abs=tol / 100), k
    if case["use_opd"]:
        assert ref_metrics["opd_term"] != 0.0
    for n, g in grads.items():
        torch.testing.assert_close(_full(g), ref_grads[n], rtol=tol, atol=tol, msg=n)
    moved = False
    for (n, p), (rn, rp), (_, p0) in zip(model.named_parameters(), ref_model.named_parameters(),
                                         start.named_parameters()):
        assert n == rn
        torch.testing.assert_close(_full(p.detach()), rp.detach(), rtol=tol, atol=tol, msg=n)
        moved |= not torch.allclose(rp.detach(), p0.detach())
    assert moved  # an update that did nothing would pass the comparison trivially
