"""Under torchrun, the ranks other than 0 wait for the producer's batch (or start) in broadcasts of at most
`heartbeat_s` each (train/async_ranks.wait_together): a wait longer than the process group's timeout survives, and
the same wait in one broadcast does not (the negative control: the timeout is real)."""

from __future__ import annotations

import datetime
import time

import torch.distributed as dist

from seedfast.distributed.data import DataParallel
from seedfast.train.async_ranks import wait_together
from tests.distributed.dist_helpers import run_on_ranks

GROUP_TIMEOUT_S = 1.0


def _waits(rank: int, world: int, heartbeat_s: float, slices: int, expect_timeout: bool) -> None:
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    calls: list[float] = []

    def fetch(wait_s: float | None, since: float) -> dict | None:  # rank 0: the producer, slow to answer
        calls.append(time.monotonic() - since)
        time.sleep(wait_s)
        return {"batch": 7} if len(calls) == slices else None

    started = time.monotonic()
    try:
        got = wait_together(fetch if rank == 0 else None, DataParallel(rank=rank, size=world),
                            heartbeat_s=heartbeat_s, group=group)
    except RuntimeError:
        assert expect_timeout, f"rank {rank}: the heartbeats did not keep the group alive"
        return
    assert not expect_timeout or rank == 0, f"rank {rank} waited {time.monotonic() - started:.1f} s in one broadcast"
    assert got == {"batch": 7}
    waited = time.monotonic() - started
    assert waited > 2 * GROUP_TIMEOUT_S, waited  # longer than any one broadcast may wait
    if rank == 0:
        assert len(calls) == slices and calls == sorted(calls)  # `since` is the wait's start in every slice


def test_a_wait_longer_than_the_group_timeout_survives_in_heartbeats():
    run_on_ranks(2, _waits, 0.4, 6, False)  # 2.4 s of waiting, 0.4 s per broadcast, the group's timeout 1 s


def test_the_same_wait_in_one_broadcast_times_out():
    run_on_ranks(2, _waits, 2.4, 1, True)
