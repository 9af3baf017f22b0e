"""LoRA through the RL loop: kill -9 twice and resume equals the uninterrupted run (metrics and adapters), the
checkpoint holds the adapters and names the base, the KL reference is the base with the adapters off, and the
run exports a merged HF folder and a PEFT adapter folder."""

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from seedfast.config import load_config
from seedfast.context.sample import StepSample
from seedfast.model import load_hf
from seedfast.model.lora import adapters_disabled, lora_modules, merged_state_dict
from seedfast.model.peft_io import load_peft_adapter
from seedfast.runtime.checkpoint import CheckpointError, list_checkpoints, load_checkpoint
from seedfast.runtime.setup import load_trainable_policy
from seedfast.scoring import score_reference
from tests.train.run_helpers import one_thread_env, run_until_checkpoint, stable_rows

LORA = ["model.lora.rank=4", "model.lora.alpha=8", "model.dtype=bf16", "algorithm=seed", "loss.kl_coef=0.05",
        "trainer.steps=3", "trainer.checkpoint_every=1", "trainer.keep_checkpoints=3"]


def _cmd(overrides, games, out, policy):
    return [sys.executable, "-m", "seedfast", "train", *overrides(games, out), *LORA, f"trainer.init_from={policy}"]


def test_a_lora_run_killed_twice_and_resumed_equals_the_uninterrupted_one(overrides, tiny_policy, train_games,
                                                                          tmp_path):
    straight = tmp_path / "straight"
    subprocess.run(_cmd(overrides, train_games, straight, tiny_policy), env=one_thread_env(), check=True,
                   capture_output=True)
    killed = tmp_path / "killed"
    cmd = _cmd(overrides, train_games, killed, tiny_policy)
    ckpt = killed / "t" / "ckpt"
    run_until_checkpoint(cmd, ckpt, 1)
    run_until_checkpoint([*cmd, "--resume", "auto"], ckpt, 2)
    subprocess.run([*cmd, "--resume", "auto"], env=one_thread_env(), check=True, capture_output=True)

    got, expected = stable_rows(killed), stable_rows(straight)
    assert [r["step"] for r in got] == [0, 1, 2]
    assert got == expected
    assert all(r["loss/kl"] > 0 for r in got[1:])  # the reference (the base) differs from the adapted policy

    last = list_checkpoints(ckpt)[-1]
    adapters = load_file(last / "model.safetensors")
    straight_adapters = load_file(list_checkpoints(straight / "t" / "ckpt")[-1] / "model.safetensors")
    assert adapters.keys() == straight_adapters.keys()
    assert all(torch.equal(adapters[k], straight_adapters[k]) for k in adapters)
    # the checkpoint holds the adapters only (fp32), and names and hashes the base instead of copying it
    assert adapters and all(k.rsplit(".", 1)[-1] in ("lora_A", "lora_B") for k in adapters)
    assert {t.dtype for t in adapters.values()} == {torch.float32}
    base = json.loads((last / "lora_base.json").read_text())
    assert base["path"] == str(tiny_policy) and len(base["sha256"]) == 64
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in adapters.items() if k.endswith("lora_B"))

    # the exports: the merged HF folder is the base plus the trained adapters; the PEFT folder holds them
    cfg = load_config(None, [*overrides(train_games, killed), *LORA, f"trainer.init_from={tiny_policy}"])
    policy, _, _ = load_trainable_policy(cfg, tiny_policy, torch.device("cpu"))
    load_peft_adapter(policy, killed / "t" / "adapter")
    for name, m in lora_modules(policy).items():
        assert torch.equal(m.lora_A.detach(), adapters[f"{name}.lora_A"])
        assert torch.equal(m.lora_B.detach(), adapters[f"{name}.lora_B"])
    exported = load_file(killed / "t" / "hf" / "model.safetensors")
    merged = merged_state_dict(policy)
    assert exported.keys() == merged.keys()
    assert all(torch.equal(exported[k], merged[k]) for k in exported)


def test_a_lora_checkpoint_resumes_only_onto_its_base(overrides, tiny_policy, train_games, tmp_path):
    out = tmp_path / "run"
    subprocess.run([*_cmd(overrides, train_games, out, tiny_policy), "trainer.steps=1"], env=one_thread_env(),
                   check=True, capture_output=True)
    ckpt = list_checkpoints(out / "t" / "ckpt")[-1]
    cfg = load_config(None, [*overrides(train_games, out), *LORA, f"trainer.init_from={tiny_policy}"])
    policy, _, _ = load_trainable_policy(cfg, tiny_policy, torch.device("cpu"))
    load_checkpoint(ckpt, policy)  # its own base: fine
    policy.lora_base = {**policy.lora_base, "sha256": "0" * 64}
    with pytest.raises(CheckpointError, match="adapts the base .*this run's base"):
        load_checkpoint(ckpt, policy, verify=False)
    full_cfg = load_config(None, [*overrides(train_games, out), f"trainer.init_from={tiny_policy}"])
    full, _, _ = load_trainable_policy(full_cfg, tiny_policy, torch.device("cpu"))
    with pytest.raises(CheckpointError, match="holds LoRA adapters; this run has no LoRA"):
        load_checkpoint(ckpt, full, verify=False)


def test_the_kl_reference_of_a_lora_run_is_the_base_with_its_adapters_off(overrides, tiny_policy, train_games,
                                                                         tmp_path):
    cfg = load_config(None, [*overrides(train_games, tmp_path), *LORA, "model.dtype=fp32",
                             f"trainer.init_from={tiny_policy}"])
    policy, trained, masters = load_trainable_policy(cfg, tiny_policy, torch.device("cpu"))
    assert trained is policy and masters is None
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in lora_modules(policy).values():
            m.lora_B.normal_(0, 0.5, generator=gen)
    vocab = policy.config.vocab_size
    samples = [StepSample(prompt_ids=torch.randint(0, vocab, (9,), generator=gen).tolist(),
                          response_ids=torch.randint(0, vocab, (4,), generator=gen).tolist(), teacher_valid=False)
               for _ in range(3)]
    with adapters_disabled(policy):
        ref = score_reference(policy, samples, token_budget=4096, temperature=1.0).logprob
    adapted = score_reference(policy, samples, token_budget=4096, temperature=1.0).logprob
    base = load_hf(tiny_policy, dtype=torch.float32).eval()
    expected = score_reference(base, samples, token_budget=4096, temperature=1.0).logprob
    torch.testing.assert_close(ref, expected, rtol=0, atol=0)
    assert (adapted - expected).abs().max() > 1e-3
