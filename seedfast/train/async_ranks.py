"""Asynchronous RL under torchrun (docs/architecture.md, 'Asynchronous rollouts', its paragraph Under torchrun):
global rank 0 alone owns the rollout producer; the other trainer ranks get each batch from it and take part in every
gather of the weights it sends.

    produced = wait_together(fetch_or_None, dp)        # rank 0's batch, on every rank (broadcast)
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
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from seedfast.distributed.data import DataParallel
from seedfast.distributed.weight_push import hf_named_tensors
from seedfast.rollout.records import RolloutResult, RolloutStats

T = TypeVar("T")
# how long the other ranks wait in one broadcast while rank 0 waits for the producer: well inside torch's
# process-group timeouts (10 minutes with NCCL, 30 with gloo), which would otherwise end a long rollout wait before
# rollout.producer_timeout_s does
HEARTBEAT_S = 60.0


def wait_together(fetch: Callable[[float | None, float], T | None] | None, dp: DataParallel | None, *,
                  heartbeat_s: float = HEARTBEAT_S, group: dist.ProcessGroup | None = None) -> T:
    """What global rank 0 waits for from the producer (its start, a batch), on every rank of the job.

    `fetch(wait_s, since)` runs on rank 0 only (None elsewhere): the value, or None when it has not come within
    `wait_s` seconds (the producer's own timeout counting from `since`, the wait's start). Rank 0 broadcasts after
    every `heartbeat_s` of waiting, None until the value is there, so no rank ever waits in one collective for longer
    than that; one broadcast over `group` (default: the job's), so the ranks of a tensor-parallel group get it too.
    One process: fetch waits as long as the producer's timeout allows."""
    since = time.monotonic()
    if dp is None:
        if fetch is None:
            raise ValueError("wait_together: one process must fetch")
        value = fetch(None, since)
        assert value is not None  # without wait_s, fetch waits until it has a value (or raises)
        return value
    while True:
        box: list[Any] = [fetch(heartbeat_s, since) if fetch is not None else None]
        dist.broadcast_object_list(box, src=0, group=group)
        if box[0] is not None:
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
