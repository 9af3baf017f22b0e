"""Every wait of the trainer on the rollout producer is bounded (train/async_rollout.py; docs/scaling.md, 'Asynchronous
rollouts: what is tested where'): a producer SIGKILLed or SIGSTOPped while the trainer pushes a version, waits for a
batch, or reads the rollouts a checkpoint keeps ahead (Trainer._staleness_state) gives one RolloutProducerError naming
what the trainer was doing, within a short group timeout, on gloo. The push's bound is the producer's ack on a pipe
(RolloutProducer.received), not the collective, which is what keeps it bounded on NCCL too
(tests/train/test_async_nccl.py, CUDA only)."""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time

import pytest
import torch

from seedfast.train.async_rollout import RolloutProducer, RolloutProducerError, RolloutProducerTimeout

SHORT_S = 3.0  # the producer's timeout and the weight group's, once the producer has started
SLACK_S = 15.0  # the death grace of a failed push (5 s) and a loaded box's pace


def _cfg(overrides, games, out):
    from seedfast.config import load_config

    # a generous timeout for the start (a loaded box takes tens of seconds to spawn and load the producer);
    # `_shorten` sets the short one once it is up
    return load_config(None, [*overrides(games, out), "algorithm=grpo", "rollout.max_staleness=1",
                              "trainer.steps=10", "rollout.producer_timeout_s=300"])


def _shorten(producer: RolloutProducer) -> None:
    producer.cfg.rollout.producer_timeout_s = SHORT_S
    producer.inbox.timeout_s = SHORT_S
    assert producer.channel.group is not None  # built by the first push
    producer.channel.group.set_timeout(datetime.timedelta(seconds=SHORT_S))


@pytest.fixture
def started(overrides, train_games, tiny_policy, tmp_path, one_torch_thread):
    """A producer that has started, taken version 0 and sent the batches of updates 0 and 1 (all it can roll out
    before version 1), read under the generous timeout (a loaded box rolls out slowly); then the short timeouts, and
    the policy to push."""
    from seedfast.runtime.setup import load_policy

    cfg = _cfg(overrides, train_games, tmp_path)
    cpu = torch.device("cpu")
    policy = load_policy(cfg, tiny_policy, cpu, trainable=False)
    producer = RolloutProducer(cfg, tiny_policy, first_step=0, first_version=0, device=cpu)
    try:
        producer.push(policy, 0)
        producer.next(0)
        producer.next(1)
        _shorten(producer)
        yield producer, policy
    finally:
        producer.close()


def _bounded(call) -> tuple[RolloutProducerError, float]:
    start = time.monotonic()
    with pytest.raises(RolloutProducerError) as caught:
        call()
    return caught.value, time.monotonic() - start


def _stop(producer: RolloutProducer) -> None:
    os.kill(producer.process.pid, signal.SIGSTOP)


# ------------------------------------------------------------------ a push


def test_a_push_to_a_stopped_producer_times_out_naming_the_version(started):
    producer, policy = started
    _stop(producer)
    err, waited = _bounded(lambda: producer.push(policy, 1))
    assert isinstance(err, RolloutProducerTimeout)
    assert f"took no weights for {SHORT_S:g} s (rollout.producer_timeout_s) while the trainer sent it policy " \
           "version 1" in str(err) and str(err).endswith("after update 0")
    assert SHORT_S <= waited < SHORT_S + SLACK_S
    assert producer.channel.group is None  # aborted: nothing of the push stays in flight


def test_a_producer_killed_during_a_push_is_named_dead(started):
    """Stopped first, so that the push is under way (its bytes sent or queued, the ack not come) when the kill
    lands."""
    producer, policy = started
    _stop(producer)
    threading.Timer(1.0, os.kill, args=(producer.process.pid, signal.SIGKILL)).start()
    err, waited = _bounded(lambda: producer.push(policy, 1))
    assert not isinstance(err, RolloutProducerTimeout)
    assert "ended (killed by signal 9) while the trainer sent it policy version 1" in str(err)
    assert waited < SHORT_S + SLACK_S


def _returns_at_once(version: int, named, bucket_bytes: int) -> dict[str, float]:
    """A send that returns before anything lands and never raises, as NCCL's broadcasts do (their `.wait()` only
    orders the GPU streams): what the trainer must not take for a push that landed."""
    for _ in named:
        pass
    return {"bytes": 0.0, "buckets": 0.0, "fingerprint": 0}


@pytest.mark.parametrize("how", ["stopped", "killed"])
def test_a_push_whose_collective_returns_at_once_is_still_bounded_by_the_producers_ack(started, monkeypatch, how):
    producer, policy = started
    monkeypatch.setattr(producer.channel, "send", _returns_at_once)
    os.kill(producer.process.pid, signal.SIGSTOP)
    if how == "killed":
        threading.Timer(1.0, os.kill, args=(producer.process.pid, signal.SIGKILL)).start()
    err, waited = _bounded(lambda: producer.push(policy, 1))
    if how == "stopped":
        assert isinstance(err, RolloutProducerTimeout)
        assert str(err).endswith(f"took no weights for {SHORT_S:g} s (rollout.producer_timeout_s) while the trainer "
                                 "sent it policy version 1, after update 0")
        assert SHORT_S <= waited
    else:
        assert "ended (killed by signal 9) while the trainer sent it policy version 1" in str(err)
    assert waited < SHORT_S + SLACK_S
    assert producer.channel.group is None


# ------------------------------------------------------------------ a batch wait


def test_a_stopped_producer_times_out_the_batch_wait(started):
    producer, _ = started
    # update 2 needs version 1, never sent: silence, as from a stopped producer
    _stop(producer)
    err, waited = _bounded(lambda: producer.next(2))
    assert isinstance(err, RolloutProducerTimeout)
    assert f"sent nothing for {SHORT_S:g} s (rollout.producer_timeout_s) while the trainer waited for the rollout " \
           "of update 2" in str(err)
    assert SHORT_S <= waited < SHORT_S + SLACK_S


def test_a_producer_killed_during_a_batch_wait_is_named_dead(started):
    producer, _ = started
    threading.Timer(1.0, os.kill, args=(producer.process.pid, signal.SIGKILL)).start()
    err, waited = _bounded(lambda: producer.next(2))
    assert "ended (killed by signal 9) while the trainer waited for the rollout of update 2" in str(err)
    assert waited < SHORT_S + SLACK_S


# ------------------------------------------------------------------ the checkpoint's wait for the rollouts ahead


def _checkpoint_wait(trainer, producer: RolloutProducer, next_step: int):
    """What a checkpoint after update next_step - 1 waits for: Trainer._staleness_state, on this producer."""
    trainer.producer, trainer.producer_runs = producer, True
    return lambda: trainer._staleness_state(next_step)


@pytest.fixture
def trainer(overrides, train_games, tiny_policy, tmp_path):
    from seedfast.train.rl import Trainer

    cfg = _cfg(overrides, train_games, tmp_path / "trainer")
    made = Trainer(cfg, policy_dir=tiny_policy)
    try:
        yield made
    finally:
        made.producer = None  # the test's producer is closed by its own fixture
        made.close()


@pytest.mark.parametrize("how", ["stopped", "killed"])
def test_a_checkpoint_waiting_for_the_rollouts_ahead_is_bounded(started, trainer, how):
    producer, _ = started
    wait = _checkpoint_wait(trainer, producer, 2)  # the checkpoint after update 1 keeps update 2's rollout
    if how == "stopped":
        _stop(producer)
    else:
        threading.Timer(1.0, os.kill, args=(producer.process.pid, signal.SIGKILL)).start()
    err, waited = _bounded(wait)
    if how == "stopped":
        assert isinstance(err, RolloutProducerTimeout) and f"sent nothing for {SHORT_S:g} s" in str(err)
        assert SHORT_S <= waited
    else:
        assert "ended (killed by signal 9)" in str(err)
    assert "while the trainer waited for the rollout of update 2" in str(err)
    assert waited < SHORT_S + SLACK_S
