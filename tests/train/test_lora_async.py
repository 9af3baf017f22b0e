"""Asynchronous RL with LoRA (train/async_rollout.py, rollout.lora_sync; docs/scaling.md, 'LoRA weight sync'): the
trainer sends the rollout producer its adapters alone, the producer's own engine runs the run's adapted model with
them, and every version's fingerprint read back from the producer's copy equals the trainer's. A producer whose
load silently does nothing (verl #7495: an async LoRA run that trained on the first policy throughout) stops the run
with one line naming the update and the version, before anything is learned from the stale rollout."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from seedfast import cli
from seedfast.config import load_config
from seedfast.distributed.weight_push import hf_named_tensors
from seedfast.model.lora import adapter_fingerprint, adapter_state_dict
from seedfast.runtime.setup import load_trainable_policy
from seedfast.train import async_rollout
from seedfast.train.async_rollout import RolloutProducer, short_print

LORA = ("model.lora.rank=4", "model.lora.alpha=8", "rollout.max_staleness=1", "trainer.checkpoint_every=0")


def test_what_each_engine_is_sent_by_default():
    """rollout.lora_sync=auto: the adapters alone to the own engine, the merged weights to vLLM, the faster of the two
    on each (benchmarks/results/lora_sync.json); adapter and merged are taken as they are."""
    from seedfast.rollout.colocated import resolve_lora_sync
    from seedfast.train.async_rollout import channel_dtype, sends_adapters

    assert [resolve_lora_sync("auto", e) for e in ("own", "vllm")] == ["adapter", "merged"]
    assert [resolve_lora_sync(s, "vllm") for s in ("adapter", "merged")] == ["adapter", "merged"]
    lora = ["model.lora.rank=4", "model.dtype=bf16"]
    vllm = ["rollout.engine=vllm", "model.path=/some/hf"]
    assert sends_adapters(load_config(None, lora))
    assert channel_dtype(load_config(None, lora)) == torch.float32  # the adapters' own dtype (the masters')
    assert not sends_adapters(load_config(None, [*lora, *vllm]))
    assert sends_adapters(load_config(None, [*lora, *vllm, "rollout.lora_sync=adapter"]))
    assert not sends_adapters(load_config(None, [*lora, "rollout.lora_sync=merged"]))
    assert not sends_adapters(load_config(None, []))  # no LoRA: the weights


def _args(overrides, games, out, policy, *extra):
    return ["train", *overrides(games, out), "algorithm=grpo", f"trainer.init_from={policy}", *LORA, *extra]


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "t" / "metrics.jsonl").read_text().splitlines()
            if "step" in json.loads(line)]


def _policy(overrides, games, out, policy):
    cfg = load_config(None, [*overrides(games, out), *LORA, f"trainer.init_from={policy}"])
    return load_trainable_policy(cfg, policy, torch.device("cpu"))[0]


def _recorded(monkeypatch) -> dict:
    """What each push sent (the trainer's adapters as its policy holds them at the push, hashed here) and what the
    producer reported for each batch (its copy's adapters after loading that batch's version)."""
    seen: dict = {"sent": {}, "rolled_out": []}
    push, next_ = RolloutProducer.push, RolloutProducer.next

    def recording_push(self, policy, version):
        seen["sent"][version] = int(adapter_fingerprint(list(adapter_state_dict(policy).items())), 16)
        return push(self, policy, version)

    def recording_next(self, step, **kwargs):
        produced = next_(self, step, **kwargs)
        if produced is not None:
            seen["rolled_out"].append((step, produced.version, produced.fingerprint))
        return produced

    monkeypatch.setattr(RolloutProducer, "push", recording_push)
    monkeypatch.setattr(RolloutProducer, "next", recording_next)
    return seen


def test_an_async_lora_run_sends_the_adapters_alone_and_the_producer_runs_them(monkeypatch, overrides, train_games,
                                                                               tiny_policy, tmp_path):
    seen = _recorded(monkeypatch)
    out = tmp_path / "adapter"
    assert cli.main(_args(overrides, train_games, out, tiny_policy, "trainer.steps=4")) == 0
    rows = _rows(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert [r["rollout/policy_version"] for r in rows] == [0, 0, 1, 2]

    # each push is the adapters' size (fp32, every adapter once), a fraction of the model's
    policy = _policy(overrides, train_games, out, tiny_policy)
    adapters = sum(t.numel() * t.element_size() for t in adapter_state_dict(policy).values())
    model = sum(t.numel() * 4 for _, t in hf_named_tensors(policy, dtype=torch.float32))
    pushes = [r for r in rows if "async/push_bytes" in r]
    assert [r["step"] for r in pushes] == [0, 1]  # versions 1 and 2 (version 0 went before update 0)
    assert all(r["async/push_bytes"] == adapters for r in pushes)
    assert adapters * 5 < model

    # every batch was rolled out with the adapters the trainer held when it sent the batch's version, bit for bit
    assert sorted(seen["sent"]) == [0, 1, 2]
    assert len(set(seen["sent"].values())) == 3  # the adapters train: each version differs
    assert [(s, v) for s, v, _ in seen["rolled_out"]] == [(0, 0), (1, 0), (2, 1), (3, 2)]
    assert all(fp == seen["sent"][v] for _, v, fp in seen["rolled_out"])
    # and the metrics log both: the version a push sent, and what the producer held for the batch just learned
    for r in pushes:
        assert r["async/push_fingerprint"] == short_print(seen["sent"][r["step"] + 1])
        assert r["async/rollout_fingerprint"] == short_print(seen["sent"][r["rollout/policy_version"]])


def test_merged_lora_sync_sends_the_whole_model(monkeypatch, overrides, train_games, tiny_policy, tmp_path):
    """rollout.lora_sync=merged: the producer holds a plain copy of the model and gets W + s·B·A each push."""
    seen = _recorded(monkeypatch)
    out = tmp_path / "merged"
    assert cli.main(_args(overrides, train_games, out, tiny_policy, "trainer.steps=3",
                          "rollout.lora_sync=merged")) == 0
    rows = _rows(out)
    policy = _policy(overrides, train_games, out, tiny_policy)
    model = sum(t.numel() * 4 for _, t in hf_named_tensors(policy, dtype=torch.float32))
    assert [r["async/push_bytes"] for r in rows if "async/push_bytes" in r] == [model]
    assert [(s, v) for s, v, _ in seen["rolled_out"]] == [(0, 0), (1, 0), (2, 1)]


def _produce_loading_nothing(*args):
    """The producer process (spawned: this runs there) with a weight load that silently copies nothing."""
    async_rollout.load_buckets = lambda model, layout, flats: None
    async_rollout.produce(*args)


def test_a_push_that_does_not_land_stops_the_run_with_one_line(monkeypatch, capsys, overrides, train_games,
                                                              tiny_policy, tmp_path):
    monkeypatch.setattr(async_rollout, "produce", _produce_loading_nothing)
    out = tmp_path / "lost"
    capsys.readouterr()
    code = cli.main(_args(overrides, train_games, out, tiny_policy, "trainer.steps=4"))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("seedfast train:")]
    assert code == 5, err[-3000:]
    assert len(lines) == 1, err[-3000:]
    # version 0 is the adapters the producer built itself (the same seed): update 2 is the first on version 1
    assert lines[0].startswith("seedfast train: rollout producer failure: update 2: the rollout producer rolled out "
                               "with LoRA adapters (rollout.lora_sync=auto) that are not policy version 1 as the "
                               "trainer sent them"), lines[0]
    assert "the push did not land" in lines[0]
    assert [r["step"] for r in _rows(out)] == [0, 1]  # nothing learned from the stale rollout
