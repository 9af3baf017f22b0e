"""Under torchrun, a checkpoint of an asynchronous run keeps every rank alive while rank 0 reads the rollouts it
keeps ahead from the producer (train/rl.py Trainer._staleness_state), and a push while rank 0 waits for the
producer's word that it holds the version (Trainer._push, RolloutProducer.received): the other ranks wait in
heartbeats (async_ranks.wait_together), so a wait longer than the process group's timeout survives and the next
collective finds every rank; the same wait in one broadcast times the group out (the negative control: the timeout
is real)."""

from __future__ import annotations

import datetime
import functools
import time
import types

import torch
import torch.distributed as dist

from seedfast.context.segments import Segment
from seedfast.distributed.data import DataParallel
from seedfast.envs.trajectory import Trajectory
from seedfast.rollout.records import RolloutResult, StepRecord
from seedfast.train import rl
from seedfast.train.async_ranks import wait_together
from seedfast.train.staleness import Produced
from tests.distributed.dist_helpers import run_on_ranks

GROUP_TIMEOUT_S = 1.0


def _produced(step: int, version: int) -> Produced:
    trajectory = Trajectory(game_id="g", task="t", meta={"group_id": 0, "policy_version": version})
    record = StepRecord(segments=(Segment("task", torch.tensor([1, 2])),), response_ids=(3,), response_logprobs=(-0.5,),
                        reward=0.0, group_id=0, trajectory_index=0, step_index=0, valid=True, parsed=True,
                        finish_reason="stop")
    return Produced(step, version, RolloutResult([trajectory], [record]))


class _SlowProducer:
    """Rank 0's producer: update s's rollout comes after `slices` waits of wait_s each."""

    def __init__(self, slices: int) -> None:
        self.slices, self.calls = slices, 0

    def next(self, step: int, *, wait_s: float | None = None, since: float | None = None) -> Produced | None:
        self.calls += 1
        time.sleep(wait_s or 0.0)
        return _produced(step, step - 1) if self.calls >= self.slices else None


def _checkpoint(rank: int, world: int, heartbeat_s: float, slices: int, expect_timeout: bool) -> None:
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    rl.wait_together = functools.partial(wait_together, heartbeat_s=heartbeat_s, group=group)  # this process's
    producer = _SlowProducer(slices)
    trainer = types.SimpleNamespace(producer_runs=True, is_main=rank == 0, dp=DataParallel(rank=rank, size=world),
                                    max_staleness=1, ahead={}, cfg=types.SimpleNamespace(
                                        trainer=types.SimpleNamespace(steps=10)))
    trainer._producer = lambda: producer
    trainer._keep_ahead = functools.partial(rl.Trainer._keep_ahead, trainer)
    started = time.monotonic()
    try:
        state, files = rl.Trainer._staleness_state(trainer, 3)
        dist.barrier(group=group)  # the checkpoint's first collective: every rank is there
    except RuntimeError:
        assert expect_timeout, f"rank {rank}: the heartbeats did not keep the group alive"
        return
    assert not expect_timeout or rank == 0, f"rank {rank} waited {time.monotonic() - started:.1f} s in one broadcast"
    assert time.monotonic() - started > 2 * GROUP_TIMEOUT_S  # longer than any one collective may wait
    assert state["policy_version"] == 3
    if rank == 0:  # rank 0 keeps the rollout ahead and writes it; the others only waited
        assert state["rollouts_ahead"] == [[3, 2]] and list(files) == ["rollouts_ahead.pkl"]
        assert producer.calls == slices
    else:
        assert state["rollouts_ahead"] == [] and producer.calls == 0


def test_a_checkpoint_read_longer_than_the_group_timeout_survives_in_heartbeats():
    run_on_ranks(2, _checkpoint, 0.4, 6, False)  # 2.4 s of reading, 0.4 s per broadcast, the group's timeout 1 s


def test_the_same_read_in_one_broadcast_times_out():
    run_on_ranks(2, _checkpoint, 2.4, 1, True)


class _SlowAck:
    """Rank 0's producer during a push: it started long ago, takes the weights at once (the send returns), and says
    it holds them after `slices` waits of wait_s each."""

    def __init__(self, slices: int) -> None:
        self.slices, self.calls, self.pushed = slices, 0, []

    def ready(self, wait_s: float | None = None, since: float | None = None) -> bool:
        return True

    def push(self, policy, version: int, *, wait: bool = True) -> dict[str, float]:
        assert not wait  # under torchrun the ack is waited for in heartbeats
        self.pushed.append(version)
        return {"async/push_bytes": 1.0}

    def received(self, version: int, wait_s: float | None = None, since: float | None = None) -> bool | None:
        self.calls += 1
        time.sleep(wait_s or 0.0)
        return True if self.calls >= self.slices else None


def _push(rank: int, world: int, heartbeat_s: float, slices: int, expect_timeout: bool) -> None:
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    rl.wait_together = functools.partial(wait_together, heartbeat_s=heartbeat_s, group=group)  # this process's
    rl.take_part = lambda cfg, policy: None  # no sharded policy to gather here
    producer = _SlowAck(slices)
    trainer = types.SimpleNamespace(is_main=rank == 0, dp=DataParallel(rank=rank, size=world), cfg=None, policy=None)
    trainer._producer = lambda: producer
    trainer._producer_ready = functools.partial(rl.Trainer._producer_ready, trainer)
    trainer._producer_received = functools.partial(rl.Trainer._producer_received, trainer)
    started = time.monotonic()
    try:
        metrics = rl.Trainer._push(trainer, 4)
        dist.barrier(group=group)  # the next step's first collective: every rank is there
    except RuntimeError:
        assert expect_timeout, f"rank {rank}: the heartbeats did not keep the group alive"
        return
    assert not expect_timeout or rank == 0, f"rank {rank} waited {time.monotonic() - started:.1f} s in one broadcast"
    assert time.monotonic() - started > 2 * GROUP_TIMEOUT_S
    if rank == 0:
        assert metrics == {"async/push_bytes": 1.0} and producer.pushed == [4] and producer.calls == slices
    else:
        assert metrics == {} and producer.calls == 0


def test_a_push_whose_ack_takes_longer_than_the_group_timeout_survives_in_heartbeats():
    run_on_ranks(2, _push, 0.4, 6, False)


def test_the_same_ack_wait_in_one_broadcast_times_out():
    run_on_ranks(2, _push, 2.4, 1, True)
