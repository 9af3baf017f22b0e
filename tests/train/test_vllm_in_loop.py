"""rollout.engine=vllm in the RL loop, on the CPU with the fake vLLM of tests/rollout/fake_vllm.py (its own copy of
the weights, the real worker extension for the push): every step wakes the engine, pushes the policy's weights in
buckets, rolls out, and puts the engine to sleep before the scoring and the update; the sync shows in the metrics,
and the train-vs-rollout log-prob gap stays at rounding. When the push silently does nothing, the gap jumps after
the first update: the metric that shows a broken sync (docs/pitfalls.md, 'Weight sync that silently does nothing')."""

from __future__ import annotations

import pytest

from seedfast.config import ConfigError, load_config
from seedfast.rollout.colocated import VLLMRollout
from seedfast.train.rl import Trainer
from tests.rollout.fake_vllm import FakeModel, install_fake_vllm


def _train(overrides, tiny_policy, train_games, tmp_path, *extra):
    cfg = load_config(None, [*overrides(train_games, tmp_path), f"model.path={tiny_policy}", "rollout.engine=vllm",
                             "rollout.sync_bucket_mb=1", "algorithm=grpo", "trainer.steps=3", *extra],
                      command="train")
    trainer = Trainer(cfg, policy_dir=tiny_policy)
    try:
        return trainer, trainer.run()
    finally:
        trainer.close()


def test_vllm_engine_is_synced_every_step(monkeypatch, overrides, tiny_policy, train_games, tmp_path):
    install_fake_vllm(monkeypatch)
    trainer, history = _train(overrides, tiny_policy, train_games, tmp_path)
    assert isinstance(trainer.engine, VLLMRollout)
    calls = [c[0] if c[0] != "rpc" else c[1] for c in trainer.engine.llm.calls]
    # three steps of: (wake weights) push... wake kv-cache, generate..., sleep
    assert calls.count("sleep") == 3 and calls.count("wake_up") == 2 * 2
    assert calls.index("seedfast_load_weights") < calls.index("generate") < calls.index("sleep")
    assert calls[-1] == "shutdown" and calls.count("shutdown") == 1  # Trainer.close shut the engine down, once
    for row in history:
        assert row["sync/tensors"] > 0 and row["sync/bytes"] > 0 and row["sync/buckets"] >= 1
        assert "time/sync" in row and "sync/sleep_seconds" in row
        assert row["rollout/logprob_gap_max"] < 1e-4  # the engine samples with the policy's weights


def test_a_sync_that_silently_does_nothing_shows_in_the_log_prob_gap(monkeypatch, overrides, tiny_policy,
                                                                     train_games, tmp_path):
    install_fake_vllm(monkeypatch)
    monkeypatch.setattr(FakeModel, "load_weights", lambda self, weights: None)  # the push is lost
    monkeypatch.setattr(VLLMRollout, "__init__", _without_verify(VLLMRollout.__init__))
    _, history = _train(overrides, tiny_policy, train_games, tmp_path)
    gaps = [row["rollout/logprob_gap_max"] for row in history]
    assert gaps[0] < 1e-4  # before any update the engine's copy (loaded from the folder) is the policy
    assert min(gaps[1:]) > 100 * max(gaps[0], 1e-7), gaps  # after it, the engine samples with stale weights


def test_the_checksum_verify_catches_it_first(monkeypatch, overrides, tiny_policy, train_games, tmp_path):
    install_fake_vllm(monkeypatch)
    monkeypatch.setattr(FakeModel, "load_weights", lambda self, weights: None)
    with pytest.raises(RuntimeError, match="vLLM weight sync failed"):
        _train(overrides, tiny_policy, train_games, tmp_path, "optim.lr=1e-2")


def _without_verify(init):
    def wrapped(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.verify = False
    return wrapped


def test_the_rollout_options_reach_vllm_llm(monkeypatch, overrides, tiny_policy, train_games, tmp_path):
    """rollout.gpu_memory_utilization / tensor_parallel / vllm_* are vllm.LLM's keyword arguments, in the RL loop's
    engine and in `seedfast collect`'s (runtime/setup.py build_engine); a null one is left to vLLM's default."""
    import torch

    from seedfast.runtime.setup import build_engine

    install_fake_vllm(monkeypatch)
    options = ["rollout.gpu_memory_utilization=0.3", "rollout.vllm_enforce_eager=true", "rollout.vllm_max_num_seqs=5",
               "rollout.vllm_max_model_len=4096"]
    want = {"gpu_memory_utilization": 0.3, "tensor_parallel_size": 1, "enforce_eager": True, "max_num_seqs": 5,
            "max_model_len": 4096}
    cfg = load_config(None, [*overrides(train_games, tmp_path), f"model.path={tiny_policy}", "rollout.engine=vllm",
                             "algorithm=grpo", *options], command="train")
    trainer = Trainer(cfg, policy_dir=tiny_policy)
    try:
        got = trainer.engine.llm.kwargs
        assert {k: got.get(k) for k in want} == want
    finally:
        trainer.close()
    collect = build_engine(cfg, tiny_policy, torch.device("cpu"))
    assert {k: collect.llm.kwargs.get(k) for k in want} == want
    defaults = load_config(None, [*overrides(train_games, tmp_path), f"model.path={tiny_policy}",
                                  "rollout.engine=vllm", "skill.collect_analyzer=oracle"], command="collect")
    got = build_engine(defaults, tiny_policy, torch.device("cpu")).llm.kwargs
    assert got["enforce_eager"] is False and got["max_model_len"] is None and "max_num_seqs" not in got
    engine = build_engine(defaults, tiny_policy, torch.device("cpu"))
    assert next(engine.llm.decoder.parameters()).dtype == torch.float32  # rollout.vllm_dtype null: model.dtype's


def test_the_engine_dtype_is_vllm_dtype_beside_a_trainer_in_model_dtype(monkeypatch, overrides, tiny_policy,
                                                                         train_games, tmp_path):
    """rollout.vllm_dtype=bf16: vLLM computes in bf16 and receives bf16 weights while the update stays in fp32 (the
    mismatch experiments/vllm_correction.py corrects); the own engine refuses the key."""
    import torch

    install_fake_vllm(monkeypatch)
    cfg = load_config(None, [*overrides(train_games, tmp_path), f"model.path={tiny_policy}", "rollout.engine=vllm",
                             "algorithm=grpo", "rollout.vllm_dtype=bf16"], command="train")
    trainer = Trainer(cfg, policy_dir=tiny_policy)
    try:
        assert next(trainer.engine.llm.decoder.parameters()).dtype == torch.bfloat16
        assert trainer.rollout_dtype == "bf16"  # the pushed weights' dtype too
        assert next(trainer.policy.parameters()).dtype == torch.float32
    finally:
        trainer.close()
    with pytest.raises(ConfigError, match="rollout.vllm_dtype=bf16 is for rollout.engine=vllm"):
        load_config(None, [*overrides(train_games, tmp_path), "rollout.vllm_dtype=bf16"], command="train")
