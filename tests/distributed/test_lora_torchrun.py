"""LoRA under `torchrun --nproc-per-node 2` (gloo, FSDP2: a frozen bf16 base sharded beside fp32 adapters): the job
killed with SIGKILL (every process of it) after its first checkpoint and resumed with `--resume auto` equals the
uninterrupted torchrun run, metrics and adapters; its DCP checkpoints hold the adapters and name the base; the run
exports the merged HF folder and the PEFT adapter folder from the whole tensors. `seedfast sft` with LoRA on 2 ranks
saves the merged weights one process saves."""

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
from safetensors.torch import load_file
from torch.distributed.checkpoint import FileSystemReader

from seedfast.config import load_config
from seedfast.model.hf_io import weight_files
from seedfast.model.lora import is_adapter_name, merged_state_dict
from seedfast.model.peft_io import load_peft_adapter
from seedfast.runtime.checkpoint import list_checkpoints
from seedfast.runtime.setup import load_trainable_policy
from tests.train.run_helpers import one_thread_env, stable_rows

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
LORA = ["model.lora.rank=4", "model.lora.alpha=8", "model.dtype=bf16", "algorithm=seed", "loss.kl_coef=0.05",
        "trainer.checkpoint_every=1", "trainer.keep_checkpoints=3", "dist.strategy=fsdp"]


def _train(overrides, games, out, policy, *extra):
    return [*TORCHRUN, "-m", "seedfast", "train", *overrides(games, out), *LORA, f"trainer.init_from={policy}",
            "trainer.steps=3", *extra]


def _run(cmd: list[str]) -> None:
    p = subprocess.run(cmd, env=one_thread_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]


def _kill_job_after_checkpoint(cmd: list[str], ckpt_dir: Path, step: int, timeout: float = 240) -> None:
    """Start the torchrun job in a process group of its own and SIGKILL every process of it (the launcher and its
    ranks, as a lost node) as soon as its checkpoint step_<step> is in place."""
    proc = subprocess.Popen(cmd, env=one_thread_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT,
                            start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while not any(p.name == f"step_{step}" for p in list_checkpoints(ckpt_dir)):
            if proc.poll() is not None:
                raise AssertionError(f"the run ended early: {proc.stderr.read().decode()[-2000:]}")
            assert time.monotonic() < deadline, f"no checkpoint step_{step} within {timeout} s"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_torchrun_lora_run_killed_and_resumed_equals_the_uninterrupted_one(overrides, tiny_policy, train_games,
                                                                             tmp_path):
    straight = tmp_path / "straight"
    _run(_train(overrides, train_games, straight, tiny_policy))
    killed = tmp_path / "killed"
    cmd = _train(overrides, train_games, killed, tiny_policy)
    ckpt = killed / "t" / "ckpt"
    _kill_job_after_checkpoint(cmd, ckpt, 1)
    assert not (killed / "t" / "hf").exists()  # it died mid-run
    resume_at = max(int(c.name.split("_")[1]) for c in list_checkpoints(ckpt))
    before = (killed / "t" / "metrics.jsonl").read_text().splitlines()[:resume_at]
    _run([*cmd, "--resume", "auto"])
    # the rows before the checkpoint are the killed run's own, wall times and all: it resumed, not restarted
    assert resume_at >= 1 and (killed / "t" / "metrics.jsonl").read_text().splitlines()[:resume_at] == before

    got, expected = stable_rows(killed), stable_rows(straight)
    assert [r["step"] for r in got] == [0, 1, 2]
    assert got == expected
    assert all(r["loss/kl"] > 0 for r in got[1:])  # the reference (the base) differs from the adapted policy

    # the DCP checkpoint: the adapters and their AdamW states, the base named and hashed
    last = list_checkpoints(ckpt)[-1]
    keys = FileSystemReader(str(last / "dcp")).read_metadata().state_dict_metadata
    model_keys = [k.removeprefix("model.") for k in keys if k.startswith("model.")]
    assert model_keys and all(is_adapter_name(k) for k in model_keys)
    base = json.loads((last / "lora_base.json").read_text())
    assert base["path"] == str(tiny_policy) and len(base["sha256"]) == 64

    # the exports: the PEFT folders of both runs are equal bit for bit (rank 0 wrote whole tensors, fp32); the
    # merged HF folder is the base plus those adapters, merged as one process merges
    adapters = load_file(killed / "t" / "adapter" / "adapter_model.safetensors")
    straight_adapters = load_file(straight / "t" / "adapter" / "adapter_model.safetensors")
    assert adapters.keys() == straight_adapters.keys()
    assert all(torch.equal(adapters[k], straight_adapters[k]) for k in adapters)
    assert {t.dtype for t in adapters.values()} == {torch.float32}
    assert any(k.endswith("lora_B.weight") and t.abs().max() > 0 for k, t in adapters.items())
    cfg = load_config(None, [*overrides(train_games, killed), *LORA, f"trainer.init_from={tiny_policy}",
                             "dist.strategy=none"])
    policy, _, _ = load_trainable_policy(cfg, tiny_policy, torch.device("cpu"))
    load_peft_adapter(policy, killed / "t" / "adapter")
    for name, t in policy.state_dict().items():
        if is_adapter_name(name):
            assert t.shape == adapters[f"base_model.model.{name}.weight"].shape  # whole, not a rank's shard
    exported = load_file(weight_files(killed / "t" / "hf")[0])
    merged = merged_state_dict(policy)
    assert exported.keys() == merged.keys()
    assert all(torch.equal(exported[k], merged[k]) for k in exported)
    assert {t.dtype for t in exported.values()} == {torch.bfloat16}


def _sft(overrides, games, out, policy, *launch):
    return [*launch, "-m", "seedfast", "sft", *overrides(games, out), f"model.path={policy}", "model.lora.rank=4",
            "model.lora.alpha=8", "model.dtype=fp32", "sft.copy_warmup_steps=0"]


def test_sharded_sft_with_lora_saves_the_merged_weights_of_one_process(overrides, tiny_policy, train_games,
                                                                        tmp_path):
    _run(_sft(overrides, train_games, tmp_path / "one", tiny_policy, sys.executable))
    _run([*_sft(overrides, train_games, tmp_path / "two", tiny_policy, *TORCHRUN), "dist.strategy=fsdp"])
    one = load_file(weight_files(tmp_path / "one" / "t" / "sft")[0])
    two = load_file(weight_files(tmp_path / "two" / "t" / "sft")[0])
    base = load_file(weight_files(tiny_policy)[0])
    assert two.keys() == one.keys() == base.keys()  # a plain HF folder: the adapters merged into the weights
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=1e-5, atol=1e-6, msg=k)
    assert any(not torch.equal(one[k], base[k].to(one[k].dtype)) for k in one)  # the adapters trained
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "two" / "t" / "sft")
    assert torch.isfinite(next(hf.parameters())).all()


@pytest.fixture(scope="module")
def tp_policy(overrides, train_games, tmp_path_factory):
    """A tiny SFT'd policy with 2 key-value heads, so tensor parallel over 2 ranks splits them."""
    from seedfast.sft import run as sft

    cfg = load_config(None, [*overrides(train_games, tmp_path_factory.mktemp("tp_policy")), "model.tiny.kv_heads=2"])
    sft.main(cfg)
    return cfg.run_dir / "sft"


def test_a_tensor_parallel_lora_run_trains_and_exports_whole_adapters(overrides, tp_policy, train_games, tmp_path):
    """dist.tp=2 with LoRA (adapters placed by their layer's style, tests/distributed/test_lora_tp.py): the TP
    sampler rolls out, the update moves the adapters, and the exports hold whole tensors: the PEFT folder's adapters
    and the merged HF folder, the base plus them."""
    _run(_train(overrides, train_games, tmp_path, tp_policy, "dist.tp=2", "trainer.steps=2"))
    rows = stable_rows(tmp_path)
    assert [r["step"] for r in rows] == [0, 1]
    assert all(r["rollout/logprob_gap_max"] < 1e-2 for r in rows)  # the TP sampler's log-probs are the scorer's
    adapters = load_file(tmp_path / "t" / "adapter" / "adapter_model.safetensors")
    cfg = load_config(None, [*overrides(train_games, tmp_path), *LORA, f"trainer.init_from={tp_policy}",
                             "dist.strategy=none"])
    policy, _, _ = load_trainable_policy(cfg, tp_policy, torch.device("cpu"))
    load_peft_adapter(policy, tmp_path / "t" / "adapter")  # every shape whole, or this raises
    assert any(k.endswith("lora_B.weight") and t.abs().max() > 0 for k, t in adapters.items())
    exported = load_file(weight_files(tmp_path / "t" / "hf")[0])
    merged = merged_state_dict(policy)
    assert exported.keys() == merged.keys()
    assert all(torch.equal(exported[k], merged[k]) for k in exported)
