"""LoRA under tensor parallel (dp_shard=1 x tp=2, 2 CPU processes over gloo, sharded by parallelize_decoder as `seedfast
train` shards): each adapter is placed by its layer's style, not split like the weight (column-parallel: A whole, B
split over the output rows; row-parallel: A split over the input columns, B whole), so the adapters add no collective
to the forward and backward; two SEED updates move the adapters as one process does (fp32, 1e-5) and leave the base
bit for bit (docs/scaling.md, 'LoRA')."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode

from seedfast.distributed.data import DataParallel
from seedfast.distributed.mesh import MESH_DIMS
from seedfast.distributed.parallelize import parallelize_decoder
from seedfast.model.decoder import build_decoder
from seedfast.model.lora import adapters_disabled, is_adapter_name, lora_modules
from tests.distributed.dist_helpers import grouped_samples, make_config, run_on_ranks
from tests.distributed.update_helpers import CASES, as_sharded_layers_compute, lora_model, lora_updates
from tests.distributed.update_helpers import full as _full

COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


def _comms(model, ids, backward: bool = True) -> Counter:
    """The collectives of one forward (and backward), by kind."""
    with CommDebugMode() as mode:
        out = model(ids, torch.tensor([0, len(ids)], dtype=torch.int32))
        if backward:
            out.float().square().mean().backward()
    model.zero_grad(set_to_none=True)
    return Counter({str(op): n for op, n in mode.get_comm_counts().items()})


def _worker(rank, world, family):
    torch.manual_seed(0)
    ref = lora_model(torch.float32, family)
    start = copy.deepcopy(ref)
    model = copy.deepcopy(ref)
    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=MESH_DIMS)
    parallelize_decoder(model, mesh)
    # only the adapters train: tensor parallel's SequenceParallel (Qwen3's q/k norms) would make its weights trainable
    assert [n for n, p in model.named_parameters() if p.requires_grad] == [
        n for n, p in ref.named_parameters() if is_adapter_name(n)]

    for path, m in lora_modules(model).items():
        colwise = path.rsplit(".", 1)[-1] in COLWISE
        a, b = (t.placements[-1] for t in (m.lora_A, m.lora_B))  # the tp dimension of the 2-D mesh
        assert (a, b) == ((Replicate(), Shard(0)) if colwise else (Shard(1), Replicate())), path
        r = m.lora_A.shape[0]
        assert m.lora_A.to_local().shape == ((r, m.in_features) if colwise else (r, m.in_features // 2))
        assert m.lora_B.to_local().shape == ((m.out_features // 2, r) if colwise else (m.out_features, r))

    # the adapters add no collective to the forward (ColwiseParallel's own placement of A, split over its r rows, and
    # a whole A beside a row-parallel layer's split input gathered 10 tensors per forward here); the backward adds at
    # most one all-reduce per adapted layer (the gradient of the factor every rank uses whole: a sum over the ranks'
    # output rows, or over their input columns) to full fine-tuning's, and nothing else
    ids = torch.arange(3, 40) % model.config.vocab_size
    forward = _comms(model, ids, backward=False)
    with adapters_disabled(model):
        assert forward == _comms(model, ids, backward=False) == Counter({"c10d_functional.all_reduce": 5})
    full = build_decoder(make_config(family), dtype=torch.float32, seed=3)
    parallelize_decoder(full, mesh)
    both, full_both = _comms(model, ids), _comms(full, ids)
    assert set(both) == set(full_both) == {"c10d_functional.all_reduce"}, (both, full_both)
    extra = both["c10d_functional.all_reduce"] - full_both["c10d_functional.all_reduce"]
    assert 0 < extra <= len(lora_modules(model)), (both, full_both)

    case = CASES["seed"]
    samples = grouped_samples(5, 8)  # every tp rank holds the same samples (one data-parallel rank)
    with as_sharded_layers_compute():
        ref_losses, ref_norms, ref_grads, _ = lora_updates(ref, samples, case)
    losses, norms, grads, _ = lora_updates(model, samples, case, dp=DataParallel.from_mesh(mesh))
    assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-7)
    assert norms == pytest.approx(ref_norms, rel=1e-5)
    assert grads.keys() == ref_grads.keys()
    for n, g in ref_grads.items():
        torch.testing.assert_close(grads[n], g, rtol=1e-5, atol=1e-7, msg=n)
    for (n, p), (_, rp) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(_full(p.detach()), rp.detach(), rtol=1e-5, atol=1e-6, msg=n)
        if not is_adapter_name(n):
            assert torch.equal(_full(p.detach()), dict(start.named_parameters())[n]), n
        else:
            assert not torch.equal(rp.detach(), dict(start.named_parameters())[n]), n


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])  # q/k/v bias; q/k norms under SequenceParallel
def test_tp2_lora_places_the_adapters_by_style_and_equals_one_process(family):
    run_on_ranks(2, _worker, family)
