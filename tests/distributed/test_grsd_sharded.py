"""GRSD's reflection update (train/reflection.py) on 2 FSDP2 ranks equals one process: the loss and every updated
weight (fp32). Each rank holds the reflections of the groups it rolled out; with fewer reflections than ranks, a
rank without any still takes part in the collectives (a one-token stand-in at weight 0)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

from seedfast.config import load_config
from seedfast.distributed.data import DataParallel
from seedfast.distributed.parallelize import apply_fsdp
from seedfast.model.decoder import build_decoder
from seedfast.runtime.optim import adamw
from seedfast.train.privileged import Reflections
from seedfast.train.reflection import reflection_update
from tests.distributed.dist_helpers import make_config, run_on_ranks

CFG = load_config(None, ["grsd.reflection_coef=0.5", "optim.grad_clip=1.0", "trainer.micro_batch_tokens=4096",
                         "rollout.max_prompt_length=16", "rollout.max_response_tokens=16",
                         "skill.max_skill_tokens=16", "rollout.temperature=1.0"])


def _reflections(n_groups: int, per_group: int, vocab: int) -> tuple[Reflections, list[int]]:
    g = torch.Generator().manual_seed(11)
    n = n_groups * per_group
    prompts = [torch.randint(0, vocab, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
               for _ in range(n)]
    responses = [torch.randint(0, vocab, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
                 for _ in range(n)]
    scores = [float((i * 5) % 4) for i in range(n)]
    responses[1], scores[1] = [], 0.0  # nothing generated: scored 0, in its group's normalization, not in the loss
    scores[2] = math.nan  # unscored: advantage 0, its tokens still counted
    return (Reflections(prompts, responses, [""] * n, [bool(r) for r in responses], scores),
            [i // per_group for i in range(n)])


def _subset(refl: Reflections, group_of: list[int], groups: set[int]) -> tuple[Reflections, list[int]]:
    idx = [i for i, gid in enumerate(group_of) if gid in groups]
    return (Reflections(*([getattr(refl, f)[i] for i in idx] for f in ("prompt_ids", "response_ids", "texts",
                                                                         "valid", "scores"))),
            [group_of[i] for i in idx])


def _adam(model):
    # eps well above the gradients' rounding: Adam divides near-zero gradients by their own size, so with a tiny
    # eps a 1e-9 difference in summation order becomes a whole step (as in test_fsdp_update.py)
    return adamw(list(model.parameters()), lr=1e-2, eps=1e-4)


def _worker(rank, world, n_groups, per_group, rank_groups):
    model = build_decoder(make_config("qwen2"), dtype=torch.float32, seed=3)
    refl, group_of = _reflections(n_groups, per_group, model.config.vocab_size)
    ref = copy.deepcopy(model)
    ref_out = reflection_update(CFG, ref, _adam(ref), refl, group_of)
    assert ref_out["grsd/reflection_loss"] != 0.0

    apply_fsdp(model, init_device_mesh("cpu", (world,)))
    mine, mine_groups = _subset(refl, group_of, rank_groups[rank])
    out = reflection_update(CFG, model, _adam(model), mine, mine_groups,
                            DataParallel(rank, world))
    assert out["grsd/reflection_loss"] == pytest.approx(ref_out["grsd/reflection_loss"], rel=1e-5, abs=1e-7)
    for (name, p), (_, rp) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.detach().full_tensor(), rp.detach(), rtol=1e-5, atol=1e-6, msg=name)
    start = build_decoder(make_config("qwen2"), dtype=torch.float32, seed=3)
    assert not torch.allclose(ref.lm_head_weight, start.lm_head_weight)  # the step moved the weights


def test_two_rank_reflection_update_equals_one_process():
    run_on_ranks(2, _worker, 4, 3, [{0, 2}, {1, 3}])


def test_ranks_without_reflections_still_take_the_step():
    # one group of 4 on rank 0, one of them invalid: 3 reflections over 4 ranks, so one rank has none after the
    # balancing and ranks 1-3 rolled out nothing
    run_on_ranks(4, _worker, 1, 4, [{0}, set(), set(), set()])
