"""LoRA under FSDP2 on 2 CPU processes (gloo) equals one process: a frozen base (fp32, or bf16 as model.dtype=bf16
gives it) sharded beside trainable fp32 adapters in the same FSDP2 units. Two GRPO/SEED updates move the adapters as
the one-process updates do (fp32: 1e-5), the base stays bit for bit what it was, only the adapters have gradients
and optimizer states, and the adapters stay fp32 whatever the base's dtype (docs/scaling.md, 'LoRA')."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

from seedfast.distributed.data import DataParallel, split_whole_groups
from seedfast.distributed.parallelize import apply_fsdp
from seedfast.model.lora import is_adapter_name
from tests.distributed.dist_helpers import grouped_samples, run_on_ranks
from tests.distributed.update_helpers import CASES, as_sharded_layers_compute, lora_model, lora_updates
from tests.distributed.update_helpers import full as _full

N_SAMPLES, BUDGET, LR = 12, 48, 1e-2


def _worker(rank, world, name, dtype_name):
    dtype = getattr(torch, dtype_name)
    case = CASES[name]
    torch.manual_seed(0)
    model = lora_model(dtype)
    start = copy.deepcopy(model)
    samples = grouped_samples(5, N_SAMPLES)
    ref = copy.deepcopy(model)
    with as_sharded_layers_compute():
        ref_losses, ref_norms, ref_grads, _ = lora_updates(ref, samples, case)

    # bf16 base: FSDP2 gathers every parameter in model.dtype (runtime/setup.py fsdp_precision), as the one-process
    # forward casts the adapters to the input's dtype; the sharded adapters and their gradients stay fp32
    param_dtype = dtype if dtype != torch.float32 else None
    apply_fsdp(model, init_device_mesh("cpu", (world,)), param_dtype=param_dtype, reduce_dtype=torch.float32)
    costs = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    mine = split_whole_groups(samples, [s.group_id for s in samples], costs, rank, world)
    assert 0 < len(mine) < len(samples)
    # each rank's share of the batch: whole groups, so their advantages are the whole batch's
    losses, norms, grads, opt = lora_updates(model, mine, case, dp=DataParallel(rank, world))

    assert set(grads) == {n for n, _ in model.named_parameters() if is_adapter_name(n)}  # the base has none
    states = [p for p in opt.state if opt.state[p]]
    assert len(states) == len(grads) and all(opt.state[p]["exp_avg"].dtype == torch.float32 for p in states)
    for n, p in model.named_parameters():
        full = _full(p.detach())
        if is_adapter_name(n):
            assert p.dtype == torch.float32 and p.grad.dtype == torch.float32, n
        else:  # the frozen base, sharded, unchanged bit for bit
            assert p.dtype == dtype and torch.equal(full, dict(start.named_parameters())[n]), n

    if dtype == torch.float32:
        assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-7)
        assert norms == pytest.approx(ref_norms, rel=1e-5)
        for n, g in ref_grads.items():
            torch.testing.assert_close(grads[n], g, rtol=1e-5, atol=1e-7, msg=n)
        for (n, p), (rn, rp) in zip(model.named_parameters(), ref.named_parameters()):
            assert n == rn
            torch.testing.assert_close(_full(p.detach()), rp.detach(), rtol=1e-5, atol=1e-6, msg=n)
    else:  # bf16 compute packs other micro-batches on 2 ranks than on one: the same gradients to bf16's rounding
        assert losses == pytest.approx(ref_losses, rel=2e-2, abs=1e-3)
        got = torch.cat([grads[n].flatten() for n in ref_grads])
        want = torch.cat([g.flatten() for g in ref_grads.values()])
        assert ((got - want).norm() / want.norm()).item() < 2e-2
    # the adapters moved: an update that did nothing would pass the comparisons trivially
    moved = [not torch.equal(_full(p.detach()), dict(start.named_parameters())[n])
             for n, p in model.named_parameters() if is_adapter_name(n)]
    assert all(moved)


@pytest.mark.parametrize("name", ["grpo", "seed"])
def test_two_rank_fsdp_lora_update_equals_one_process(name):
    run_on_ranks(2, _worker, name, "float32")


def test_two_rank_fsdp_lora_over_a_bf16_base_keeps_fp32_adapters_and_the_base():
    run_on_ranks(2, _worker, "grpo", "bfloat16")


def _merged_scoring_worker(rank, world):
    from seedfast.distributed.parallelize import unsharded
    from seedfast.model.lora import adapters_merged, lora_modules
    from seedfast.scoring import score

    torch.manual_seed(0)
    model = lora_model(torch.float32)
    ref = copy.deepcopy(model)
    samples = grouped_samples(5, N_SAMPLES)
    apply_fsdp(model, init_device_mesh("cpu", (world,)), param_dtype=None, reduce_dtype=torch.float32)
    costs = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    mine = split_whole_groups(samples, [s.group_id for s in samples], costs, rank, world)
    for step in range(2):  # scored, updated, scored again: a merged copy of the first adapters would be stale
        with unsharded(model), adapters_merged(model):
            got = score(model, samples, token_budget=4096).logprob
        with adapters_merged(ref):
            want = score(ref, samples, token_budget=4096).logprob
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=f"scoring {step}")
        # resharded, no rank keeps a whole merged layer (nor one keyed by storage FSDP2 freed)
        assert all(m._merged is None for m in lora_modules(model).values())
        lora_updates(model, mine, CASES["grpo"], steps=1, dp=DataParallel(rank, world))
        lora_updates(ref, samples, CASES["grpo"], steps=1, dp=None)


def test_a_sharded_lora_policy_scores_with_merged_weights_and_keeps_none_after_resharding():
    run_on_ranks(2, _merged_scoring_worker)
