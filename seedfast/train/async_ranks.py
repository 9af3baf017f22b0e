"""Asynchronous RL under torchrun (docs/architecture.md, 'Asynchronous rollouts', its paragraph Under torchrun):
global rank 0 alone owns the rollout producer; the other trainer ranks get each batch from it and take part in every
gather of the weights it sends.

    produced = share_produced(produced_or_None, dp)     # rank 0's batch, on every rank (broadcast)
    result, env = rank_share(produced.result, produced.env_metrics, dp.rank, dp.size)
    ... learn from `result` as the synchronous loop learns from this rank's rollout ...
    take_part_in_push(policy, dtype)                     # ranks other than 0, while rank 0 sends a version

A batch is split as the synchronous loop splits its tasks (`tasks[rank::size]`): the group of task k goes whole to
data-parallel rank k mod size, so advantages computed per group on a rank are the group's, and the update that
follows (the samples spread by token count, the loss a share of the global token-mean) is the synchronous torchrun
update on the same batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist

from seedfast.distributed.data import DataParallel
from seedfast.distributed.weight_push import hf_named_tensors
from seedfast.rollout.records import RolloutResult, RolloutStats
from seedfast.train.staleness import Produced


def share_produced(produced: Produced | None, dp: DataParallel | None) -> Produced:
    """Global rank 0's batch (`produced`; None on the other ranks) on every rank of the job: one broadcast over the
    default group, so the ranks of a tensor-parallel group get it too."""
    if dp is None:
        if produced is None:
            raise ValueError("share_produced: one process must hold the batch")
        return produced
    box: list[Any] = [produced]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def rank_share(result: RolloutResult, env_metrics: dict[str, float], rank: int, size: int
               ) -> tuple[RolloutResult, dict[str, float]]:
    """Data-parallel rank `rank`'s share of a whole batch: the trajectories of every task k with k mod size == rank
    (the group ids are the task indices, as the agent loop numbers them), their step records re-indexed into the
    share's trajectory list, and the batch's counters.

    The producer counts the batch as a whole (generate calls, prompt truncations and environment counters are not
    per group), so rank 0's share carries all of them and the others zeros: the step's metrics add them over the
    ranks (`global_means`), which gives the batch's."""
    keep = [i for i, t in enumerate(result.trajectories) if t.meta["group_id"] % size == rank]
    index = {old: new for new, old in enumerate(keep)}
    trajectories = [dataclasses.replace(result.trajectories[i],
                                        meta={**result.trajectories[i].meta, "trajectory_index": index[i]})
                    for i in keep]
    steps = [dataclasses.replace(s, trajectory_index=index[s.trajectory_index])
             for s in result.steps if s.trajectory_index in index]
    stats = result.stats if rank == 0 else RolloutStats()
    env = dict(env_metrics) if rank == 0 else dict.fromkeys(env_metrics, 0.0)
    return RolloutResult(trajectories, steps, stats), env


def take_part_in_push(policy: torch.nn.Module, dtype: torch.dtype) -> None:
    """A rank other than 0 while rank 0 sends a version to the producer: the same gathers, in the same order, one
    full tensor at a time (weight_push.hf_named_tensors; each is dropped at once), so rank 0's `full_tensor()`
    collectives find their peers."""
    for _ in hf_named_tensors(policy, dtype=dtype):
        pass
