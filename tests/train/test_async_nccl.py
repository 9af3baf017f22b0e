"""The push's bound on NCCL (train/async_rollout.py RolloutProducer.received, distributed/weight_channel.py): the
trainer on GPU 0, the producer on GPU 1 (rollout.devices=1), the weights over an NCCL group. NCCL's broadcast never
raises on a stopped or dead peer and its `.wait()` does not block the CPU, so the CPU-side checks of the gloo tests
(tests/train/test_async_waits.py) say nothing about it. What this checks, where two GPUs exist:
- a push to a SIGSTOPped producer ends in one RolloutProducerTimeout naming the version within the producer's timeout
  (the ack on the pipe), not in NCCL's watchdog aborting the trainer's process, which would end the test itself;
- after it the weight group is aborted and the trainer's GPU is usable: a synchronize of GPU 0 returns at once, so
  the run's teardown and its one line are not stuck behind a broadcast that can never complete;
- a producer SIGKILLed during a push is named dead (`killed by signal 9`), as on gloo.
Skipped with fewer than two GPUs: NCCL refuses two ranks on one GPU."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

from seedfast.train.async_rollout import RolloutProducer, RolloutProducerError, RolloutProducerTimeout

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                 reason="needs two CUDA GPUs: the trainer's and the rollout's (NCCL refuses two ranks "
                                        "on one GPU)")]

SHORT_S = 5.0


@pytest.fixture
def started(overrides, train_games, tiny_policy, tmp_path):
    from seedfast.config import load_config
    from seedfast.runtime.setup import load_policy

    cfg = load_config(None, [*overrides(train_games, tmp_path), "algorithm=grpo", "trainer.device=cuda",
                             "rollout.max_staleness=1", "rollout.devices=1", "trainer.steps=10",
                             "rollout.producer_timeout_s=300"])
    gpu = torch.device("cuda", 0)
    policy = load_policy(cfg, tiny_policy, gpu, trainable=False)
    producer = RolloutProducer(cfg, tiny_policy, first_step=0, first_version=0, device=gpu)
    try:
        producer.push(policy, 0)
        producer.next(0)
        producer.cfg.rollout.producer_timeout_s = SHORT_S  # the ack's bound; the group keeps its own, longer one
        yield producer, policy
    finally:
        producer.close()


def test_a_push_to_a_stopped_producer_ends_on_the_cpu_and_leaves_the_gpu_usable(started):
    producer, policy = started
    os.kill(producer.process.pid, signal.SIGSTOP)
    start = time.monotonic()
    with pytest.raises(RolloutProducerTimeout, match="took no weights for 5 s .* sent it policy version 1"):
        producer.push(policy, 1)
    assert time.monotonic() - start < SHORT_S + 10
    assert producer.channel.group is None
    synced = time.monotonic()
    torch.cuda.synchronize(0)
    assert time.monotonic() - synced < 5


def test_a_producer_killed_during_a_push_is_named_dead(started):
    producer, policy = started
    os.kill(producer.process.pid, signal.SIGSTOP)
    threading.Timer(1.0, os.kill, args=(producer.process.pid, signal.SIGKILL)).start()
    with pytest.raises(RolloutProducerError, match=r"ended \(killed by signal 9\) while the trainer sent it policy "
                                                   r"version 1"):
        producer.push(policy, 1)
    torch.cuda.synchronize(0)
