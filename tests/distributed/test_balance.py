"""Whole groups per rank for the rollout, token-balanced samples for the update (seedfast/distributed/data.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from seedfast.context.sample import StepSample
from seedfast.distributed.data import DataParallel, assign_groups, balance_samples, split_whole_groups
from tests.distributed.dist_helpers import run_on_ranks


def test_assign_groups_balances_whole_groups_by_hand():
    # heaviest first onto the least loaded rank: 9 -> r0, 7 -> r1, 5 -> r1 (7 < 9), 4 -> r0, 1 -> r1
    assert assign_groups([4, 9, 1, 7, 5], 2) == [0, 0, 1, 1, 1]
    assert assign_groups([], 3) == []


def test_split_whole_groups_never_splits_a_group():
    items = list(range(9))
    group_of = [0, 0, 0, 1, 1, 2, 2, 2, 2]
    costs = [1] * 9
    shares = [split_whole_groups(items, group_of, costs, r, 2) for r in range(2)]
    assert sorted(shares[0] + shares[1]) == items
    for share in shares:
        assert {group_of[i] for i in share}.isdisjoint({group_of[i] for s in shares if s is not share for i in s})
    assert shares[0] == [5, 6, 7, 8] and shares[1] == [0, 1, 2, 3, 4]  # group 2 (4 items) first, to rank 0


def _worker(rank, world):
    # rank 0 rolled out 6 long samples, rank 1 one short one: 6 x 13 tokens against 4
    n = 6 if rank == 0 else 1
    samples = [StepSample(prompt_ids=[1] * (10 if rank == 0 else 2), response_ids=[2] * (3 if rank == 0 else 2),
                          sample_id=(rank, i)) for i in range(n)]
    adv = torch.tensor([10.0 * rank + i for i in range(n)])
    tokens = torch.cat([torch.full((len(s.response_ids),), 100.0 * rank + i) for i, s in enumerate(samples)])
    got, got_adv, per_token = balance_samples(DataParallel(rank, world), samples, adv,
                                              {"old": tokens, "ref": None})
    assert per_token["ref"] is None
    # what follows each sample moved with it
    off = 0
    for s, a in zip(got, got_adv):
        r, i = s.sample_id
        assert float(a) == 10.0 * r + i
        assert torch.equal(per_token["old"][off:off + len(s.response_ids)],
                           torch.full((len(s.response_ids),), 100.0 * r + i))
        off += len(s.response_ids)
    assert off == len(per_token["old"])
    every = [None] * world
    dist.all_gather_object(every, ([s.sample_id for s in got], sum(len(s.prompt_ids) + len(s.response_ids)
                                                                   for s in got)))
    ids = sorted(i for part, _ in every for i in part)
    assert ids == sorted([(0, i) for i in range(6)] + [(1, 0)])  # each sample exactly once
    loads = [load for _, load in every]
    assert max(loads) - min(loads) <= 13  # at most one sample apart (before: 78 against 4)


def test_balance_samples_moves_samples_with_their_tensors():
    run_on_ranks(2, _worker)
