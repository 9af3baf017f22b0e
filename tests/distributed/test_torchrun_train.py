"""`torchrun --nproc-per-node 2 -m seedfast train configs/demo_cpu.yaml ...` on CPU (gloo, FSDP2): the RL loop
end to end with SEED, rank 0 alone writing metrics, the DCP checkpoint and an HF export transformers loads; a
rank killed with SIGKILL ends the whole job in bounded time, and `--resume auto` continues with no step lost or
repeated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from seedfast.runtime.checkpoint import list_checkpoints

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]  # a free port


def _cmd(overrides, games, out, policy, *extra):
    return [*TORCHRUN, "-m", "seedfast", "train", "configs/demo_cpu.yaml", *overrides(games, out),
            "algorithm=seed", f"trainer.init_from={policy}", "dist.strategy=fsdp", *extra]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_torchrun_two_ranks_train_end_to_end(overrides, tiny_policy, train_games, tmp_path):
    p = subprocess.run(_cmd(overrides, train_games, tmp_path, tiny_policy, "trainer.steps=2"), env=_env(),
                       capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert p.returncode == 0, p.stderr[-3000:]
    run = tmp_path / "t"
    assert _steps(run) == [0, 1]  # one writer: two ranks appending would give each step twice
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert first["rollout/trajectories"] == 2 * 2  # tasks_per_batch x n, rolled out by both ranks together
    assert first["loss/opd_term"] != 0.0  # SEED's distillation term ran
    ckpt = list_checkpoints(run / "ckpt")[-1]
    assert (ckpt / "dcp" / ".metadata").is_file() and {f.name for f in ckpt.glob("rng_rank*.pt")} == {
        "rng_rank0.pt", "rng_rank1.pt"}
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(run / "hf")
    assert sum(p.numel() for p in hf.parameters()) > 0 and (run / "hf" / "tokenizer_config.json").is_file()
    assert torch.isfinite(next(hf.parameters())).all()


@pytest.fixture(scope="module")
def tp_policy(overrides, train_games, tmp_path_factory):
    """A tiny SFT'd policy with 2 key-value heads, so tensor parallel over 2 ranks splits them."""
    from seedfast.config import load_config
    from seedfast.sft import run as sft

    cfg = load_config(None, [*overrides(train_games, tmp_path_factory.mktemp("tp_policy")), "model.tiny.kv_heads=2"])
    sft.main(cfg)
    return cfg.run_dir / "sft"


def test_torchrun_tensor_parallel_train_end_to_end(overrides, tp_policy, train_games, tmp_path):
    """dist.tp=2 (one tensor-parallel group of 2 ranks, FSDP2 over a data-parallel dimension of 1): the TP sampler
    rolls out, the vocabulary-parallel head scores and updates, and the export is the whole model."""
    p = subprocess.run(_cmd(overrides, train_games, tmp_path, tp_policy, "trainer.steps=2", "dist.tp=2"),
                       env=_env(), capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert p.returncode == 0, p.stderr[-3000:]
    run = tmp_path / "t"
    assert _steps(run) == [0, 1]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        assert row["rollout/trajectories"] == 2 * 2  # both TP ranks roll out the same groups: counted once
        assert row["loss/opd_term"] != 0.0 and row["optim/updates_applied"] > 0
        # the TP sampler's log-probs are the TP scoring pass's: a broken vocabulary-parallel head shows here
        assert row["rollout/logprob_gap_max"] < 1e-4
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(run / "hf")
    assert hf.config.num_key_value_heads == 2  # the global count, not a rank's share
    start = transformers.AutoModelForCausalLM.from_pretrained(tp_policy)
    for (name, a), (_, b) in zip(hf.named_parameters(), start.named_parameters()):
        assert a.shape == b.shape, name  # whole tensors, not one rank's shard
    assert any(not torch.equal(a, b) for a, b in zip(hf.parameters(), start.parameters()))  # trained


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def test_sigkill_of_one_rank_ends_the_job_and_resume_continues(overrides, tiny_policy, train_games, tmp_path):
    cmd = _cmd(overrides, train_games, tmp_path, tiny_policy, "trainer.steps=3", "trainer.keep_checkpoints=3")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=root)
    ckpt = tmp_path / "t" / "ckpt"
    deadline = time.monotonic() + 240
    while not any(c.name == "step_1" for c in list_checkpoints(ckpt)):
        assert proc.poll() is None, "the run ended before its first checkpoint"
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.05)
    workers = _children(proc.pid)
    assert len(workers) == 2
    os.kill(workers[1], signal.SIGKILL)
    killed_at = time.monotonic()
    proc.wait(timeout=120)  # torchrun stops the surviving rank: no hang
    assert proc.returncode != 0 and time.monotonic() - killed_at < 120

    resume_at = max(int(c.name.split("_")[1]) for c in list_checkpoints(ckpt))
    before = (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()[:resume_at]
    p = subprocess.run([*cmd, "--resume", "auto"], env=_env(), capture_output=True, text=True, timeout=300, cwd=root)
    assert p.returncode == 0, p.stderr[-3000:]
    after = (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()
    assert _steps(tmp_path / "t") == [0, 1, 2]  # none lost, none repeated
    # the steps before the checkpoint are the killed run's own rows (a fresh start would rewrite them, with other
    # wall times): the run resumed
    assert resume_at >= 1 and after[:resume_at] == before
