"""Kill -9 twice and resume: the metrics equal those of an uninterrupted run with the same seed."""

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from seedfast.runtime.checkpoint import list_checkpoints
from tests.train.run_helpers import one_thread_env, run_until_checkpoint

VOLATILE = ("time/", "throughput/", "memory/")


def _cmd(overrides, games, out, policy, *extra):
    return [sys.executable, "-m", "seedfast", "train", *overrides(games, out), "algorithm=grpo",
            "trainer.steps=3", "trainer.checkpoint_every=1", "trainer.keep_checkpoints=3",
            f"trainer.init_from={policy}", *extra]


def _stable(path):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_killed_twice_and_resumed_equals_uninterrupted(overrides, tiny_policy, train_games, tmp_path, dtype):
    """bf16: the module computes in bf16 over fp32 master weights (runtime/precision.py); the checkpoints hold the
    masters, so a resume continues exactly."""
    straight = tmp_path / "straight"
    subprocess.run(_cmd(overrides, train_games, straight, tiny_policy, f"model.dtype={dtype}"), env=one_thread_env(),
                   check=True, capture_output=True)

    killed = tmp_path / "killed"
    cmd = _cmd(overrides, train_games, killed, tiny_policy, f"model.dtype={dtype}")
    ckpt = killed / "t" / "ckpt"
    run_until_checkpoint(cmd, ckpt, 1)
    run_until_checkpoint([*cmd, "--resume", "auto"], ckpt, 2)
    subprocess.run([*cmd, "--resume", "auto"], env=one_thread_env(), check=True, capture_output=True)

    expected = _stable(straight / "t" / "metrics.jsonl")
    got = _stable(killed / "t" / "metrics.jsonl")
    assert [r["step"] for r in got] == [0, 1, 2]
    assert got == expected
    master = load_file(list_checkpoints(ckpt)[-1] / "model.safetensors")
    exported = load_file(killed / "t" / "hf" / "model.safetensors")
    assert {t.dtype for t in master.values()} == {torch.float32}  # the masters, whatever computes
    assert {t.dtype for t in exported.values()} == {getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[dtype])}
