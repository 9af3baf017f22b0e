"""The rollout correction over data-parallel ranks (gloo on CPU): the diagnostics reduced over the ranks equal one
process's over all samples (a rank without samples included), and the weight moves with its sample when the update
rebalances the samples (docs/algorithms.md, 'Rollout correction')."""

from __future__ import annotations

import pytest
import torch

from seedfast.config import CorrectionConfig
from seedfast.context.sample import StepSample
from seedfast.distributed.data import DataParallel, balance_samples
from seedfast.train.correction import CorrectionTally, correction_weights
from tests.distributed.dist_helpers import run_on_ranks

CORRECTION = CorrectionConfig(mode="token_tis", token_clip=1.3)


def _samples(rank: int) -> tuple[list[StepSample], torch.Tensor]:
    """Rank 0: three samples, rank 1: one, rank 2: none; ℓtrain and behaviour log-probs differ by rank and sample."""
    n = {0: 3, 1: 1}.get(rank, 0)
    samples, train = [], []
    for i in range(n):
        length = 2 + i + rank
        lp = -torch.linspace(0.2, 1.5, length) * (1 + rank + i)
        shift = 0.05 * (i + 1) * (-1) ** (rank + i) * torch.arange(1, length + 1)
        samples.append(StepSample(prompt_ids=[1, 2], response_ids=[3] * length, sample_id=(rank, i),
                                  meta={"rollout_logprobs": lp - shift}))
        train.append(lp)
    return samples, torch.cat(train) if train else torch.zeros(0)


def _worker(rank, world):
    samples, train = _samples(rank)
    weight, tally = correction_weights(train, samples, CORRECTION) if samples else (None, CorrectionTally())
    tally.reduce(DataParallel(rank, world))
    every = [_samples(r) for r in range(world)]
    all_samples = [s for part, _ in every for s in part]
    _, whole = correction_weights(torch.cat([t for _, t in every]), all_samples, CORRECTION)
    assert tally.metrics().keys() == whole.metrics().keys()
    for key, value in whole.metrics().items():
        assert tally.metrics()[key] == pytest.approx(value, rel=1e-12), key
    if weight is None:
        weight = torch.zeros(0)
    moved, _, per_token = balance_samples(DataParallel(rank, world), samples, torch.zeros(len(samples)),
                                          {"old": train, "pg_weight": weight})
    off = 0
    for s in moved:  # each moved sample's weight is the one its own log-probs give
        n = len(s.response_ids)
        own, _ = correction_weights(per_token["old"][off:off + n], [s], CORRECTION)
        assert torch.equal(per_token["pg_weight"][off:off + n], own)
        off += n


def test_the_reduced_diagnostics_equal_one_process_and_the_weight_moves_with_its_sample():
    run_on_ranks(3, _worker)
