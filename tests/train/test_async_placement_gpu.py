"""Asynchronous RL with the rollout on a GPU of its own (rollout.devices, runtime/placement.py): the trainer on GPU
0, the producer on GPU 1, the weights over an NCCL group. Needs two GPUs (skipped elsewhere, as on a one-GPU window:
NCCL refuses two ranks on one GPU). docs/kernels.md, 'The tests that run only on a GPU'."""

from __future__ import annotations

import json

import pytest
import torch

from seedfast import cli

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                 reason="needs two CUDA GPUs: the trainer's and the rollout's")]


def test_the_producer_rolls_out_on_its_own_gpu_with_the_pushed_weights(overrides, train_games, tiny_policy,
                                                                        tmp_path):
    out = tmp_path / "run"
    assert cli.main(["train", *overrides(train_games, out), "algorithm=grpo", f"trainer.init_from={tiny_policy}",
                     "trainer.steps=3", "trainer.device=cuda", "rollout.max_staleness=1", "rollout.devices=1"]) == 0
    rows = [json.loads(line) for line in (out / "t" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "step" in r]
    assert [r["step"] for r in rows] == [0, 1, 2]
    # every update after the first learned from the policy one update old, whose weights went over NCCL; the
    # trainer checks each batch's fingerprint against what it sent (train/staleness.check_weights), so a run that
    # got here rolled out with exactly the pushed weights
    assert [r["rollout/staleness_max"] for r in rows] == [0.0, 1.0, 1.0]
    assert [r["rollout/policy_version"] for r in rows] == [0.0, 0.0, 1.0]
    assert rows[0]["async/push_bytes"] > 0  # version 1, sent after update 0
    # nothing of the trainer's went to the rollout's GPU
    assert torch.cuda.memory_allocated(1) == 0
