"""LoRA adapter sync into the REAL vLLM (its CPU back end, `make test-vllm`; docs/scaling.md, 'LoRA weight sync'):
vLLM keeps the base it loaded and serves the trainer's adapters with its LoRA support (vllm_engine.py
`load_adapter`: a PEFT folder per push, a new LoRA id, the adapter's slot in every LoRA layer read back and hashed).
Checked against what vLLM computes: greedy tokens and log-probs equal the own sampler's on the adapted policy, push
after push (a second push is served, not the first); the hash vLLM's LoRA layers report equals the trainer's
adapters', and a push that does not land (the add never reaches the worker; a LoRA id reused, which vLLM serves from
its cache) fails it. Then the RL loop: synchronous (rollout.lora_sync=adapter, and =merged for comparison) and one
step off (the producer's vLLM), the sync carrying the adapters' bytes and the train-vs-rollout gap at fp32 rounding.
Skipped without vllm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from seedfast.config import load_config  # noqa: E402
from seedfast.distributed.weight_push import hf_named_tensors  # noqa: E402
from seedfast.model.lora import LoRASpec, adapter_state_dict, adapters_disabled, add_lora, lora_modules  # noqa: E402
from seedfast.rollout.colocated import OwnRollout, VLLMRollout, full_adapters  # noqa: E402
from seedfast.rollout.own_engine import Sampler  # noqa: E402
from seedfast.rollout.vllm_engine import VLLMEngine, lora_slot_print  # noqa: E402
from seedfast.sampling_params import SamplingParams  # noqa: E402
from tests.vllm_real.vllm_helpers import GAP_FP32, SMALL_ENGINE, STEPS, engine_env, prompts, tiny_policy  # noqa: E402

NEW_TOKENS = 8
LORA = LoRASpec(rank=4, alpha=8)


def _train_adapters(policy: torch.nn.Module, seed: int) -> None:
    """A stand-in for an update: every adapter moves, enough to change what greedy decoding picks."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in lora_modules(policy).values():
            m.lora_B.add_(torch.randn(m.lora_B.shape, generator=gen) * 0.3)
            m.lora_A.add_(torch.randn(m.lora_A.shape, generator=gen) * 0.1)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(the adapted fp32 policy, a vLLM engine over its base with LoRA rank 4 served): one engine for the module."""
    folder = tmp_path_factory.mktemp("vllm_lora")
    policy = tiny_policy("qwen3", folder)  # the base, saved before the adapters are added
    add_lora(policy, LORA, seed=0)
    _train_adapters(policy, 1)
    engine_env()
    engine = VLLMEngine(str(folder), dtype="fp32", max_model_len=256, enforce_eager=True, max_num_seqs=8,
                        lora_rank=LORA.rank)
    yield policy, engine
    engine.close()


def _same_as_own(engine, policy) -> list[float]:
    """vLLM's greedy completions equal the own sampler's on `policy`, tokens and log-probs; returns the log-probs."""
    ours = Sampler(policy).generate_full(prompts(), SamplingParams(NEW_TOKENS, temperature=0.0))
    theirs = engine.generate_full(prompts(), SamplingParams(NEW_TOKENS, temperature=0.0))
    for a, b in zip(ours, theirs):
        assert b.token_ids == a.token_ids
        torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-3, rtol=0)
    return [lp for g in theirs for lp in g.logprobs]


def _expected(policy) -> int:
    return int(lora_slot_print(full_adapters(policy), LORA.scaling, torch.float32), 16)


def test_the_engine_serves_the_adapters_it_was_sent(setup):
    policy, engine = setup
    stats = engine.load_adapter(full_adapters(policy), LORA)
    # vLLM's LoRA layers hold the trainer's adapters bit for bit (as vLLM keeps them: B scaled by alpha / r)
    assert stats["verified_workers"] == 1 and stats["fingerprint"] == _expected(policy)
    assert stats["bytes"] == sum(t.numel() * 4 for t in adapter_state_dict(policy).values())
    served = _same_as_own(engine, policy)
    with adapters_disabled(policy):  # and the adapters matter: the base alone computes something else
        base = Sampler(policy).generate_full(prompts(), SamplingParams(NEW_TOKENS, temperature=0.0))
    base_lp = [lp for g in base for lp in g.logprobs]
    assert len(base_lp) != len(served) or max(abs(a - b) for a, b in zip(base_lp, served)) > 0.05


def test_a_second_push_is_served_not_the_first(setup):
    policy, engine = setup
    engine.load_adapter(full_adapters(policy), LORA)
    first_id, first_path = engine.lora_request.lora_int_id, Path(engine.lora_request.lora_path)
    before = _same_as_own(engine, policy)
    _train_adapters(policy, 2)
    stats = engine.load_adapter(full_adapters(policy), LORA)
    assert stats["fingerprint"] == _expected(policy)
    assert engine.lora_request.lora_int_id == first_id + 1 and not first_path.exists()  # the old folder is gone
    assert set(engine.llm.llm_engine.list_loras()) == {first_id + 1}  # one adapter in vLLM: the newest
    after = _same_as_own(engine, policy)
    assert len(after) != len(before) or max(abs(a - b) for a, b in zip(after, before)) > 0.05


@pytest.mark.parametrize("fault", ["add lost", "id reused"])
def test_a_push_that_does_not_land_fails_the_verify(setup, monkeypatch, tmp_path, fault):
    """'add lost': the LoRA never reaches the worker; 'id reused': the new adapters under the id vLLM already holds,
    which it serves from its cache without reading the folder (vLLM keys adapters by lora_int_id)."""
    policy, engine = setup
    engine.load_adapter(full_adapters(policy), LORA)
    served = engine.lora_request
    _train_adapters(policy, 3)
    if fault == "add lost":
        monkeypatch.setattr(engine.llm.llm_engine, "add_lora", lambda request: True)
    else:  # the engine believes the adapter before is one id lower: the new one gets the id being served
        engine.lora_request = type(served)("earlier", served.lora_int_id - 1, str(tmp_path / "earlier"))
    with pytest.raises(RuntimeError, match="vLLM LoRA sync failed: adapter .* the engine does not run the adapters"):
        engine.load_adapter(full_adapters(policy), LORA)
    monkeypatch.undo()
    engine.load_adapter(full_adapters(policy), LORA)  # a push that lands afterwards is served
    _same_as_own(engine, policy)


# ------------------------------------------------------------------ the RL loop


def _cfg(overrides, policy: Path, games: Path, out: Path, *extra: str):
    return load_config(None, [*overrides(games, out), f"model.path={policy}", "rollout.engine=vllm",
                              "rollout.sync_bucket_mb=1", "algorithm=grpo", f"trainer.steps={STEPS}",
                              "trainer.checkpoint_every=0", "optim.lr=1e-2", "model.lora.rank=4",
                              "model.lora.alpha=8", *SMALL_ENGINE, *extra], command="train")


def _run(cfg, policy: Path) -> tuple[Any, list[dict[str, Any]], float]:
    from seedfast.train.rl import Trainer

    trainer = Trainer(cfg, policy_dir=policy)
    try:
        start = {k: v.clone() for k, v in adapter_state_dict(trainer.policy).items()}
        history = trainer.run()
        moved = max(float((v - start[k]).abs().max()) for k, v in adapter_state_dict(trainer.policy).items())
        return trainer, history, moved
    finally:
        trainer.close()


@pytest.mark.usefixtures("small_engine")
@pytest.mark.parametrize("sync", ["adapter", "merged"])
def test_the_synchronous_loop_syncs_lora_and_the_gap_stays_at_rounding(overrides, policy32, train_games, tmp_path,
                                                                        sync):
    cfg = _cfg(overrides, policy32, train_games, tmp_path, f"rollout.lora_sync={sync}")
    trainer, history, moved = _run(cfg, policy32)
    assert isinstance(trainer.engine, VLLMRollout)
    assert moved > 1e-3  # the adapters train: the engine must follow them
    adapters = sum(t.numel() * 4 for t in adapter_state_dict(trainer.policy).values())
    model = sum(t.numel() * 4 for _, t in hf_named_tensors(trainer.policy))
    if sync == "adapter":  # the adapters alone each step, served by vLLM's LoRA layers: one id per push
        assert [r["sync/bytes"] for r in history] == [adapters] * STEPS
        assert trainer.engine.engine.lora_request.lora_int_id == STEPS
    else:  # the merged weights: the whole model each step, no LoRA in vLLM
        assert [r["sync/bytes"] for r in history] == [model] * STEPS
        assert trainer.engine.engine.lora_request is None
    print(f"lora_sync={sync}: sync/push_seconds {[round(r['sync/push_seconds'], 4) for r in history]}")
    # vLLM sampled every token with the adapters the trainer held at that step (its log-probs, the trainer's)
    assert all(r["rollout/logprob_gap_max"] < GAP_FP32 for r in history), [r["rollout/logprob_gap_max"]
                                                                         for r in history]


@pytest.mark.usefixtures("small_engine")
def test_one_step_off_the_producers_vllm_serves_each_version_sent(overrides, policy32, train_games, tmp_path):
    cfg = _cfg(overrides, policy32, train_games, tmp_path, "rollout.max_staleness=1", "rollout.lora_sync=adapter")
    trainer, history, moved = _run(cfg, policy32)
    assert isinstance(trainer.engine, OwnRollout)  # the producer's vLLM rolls out
    assert moved > 1e-3
    assert [r["rollout/policy_version"] for r in history] == [0, 0, 1]
    adapters = sum(t.numel() * 4 for t in adapter_state_dict(trainer.policy).values())
    # version 1 sent after update 0 (version 0 went before it): the adapters' bytes; the producer's vLLM verified
    # its LoRA layers against them, and the fingerprint it returned (the adapters received) is the one sent
    assert [r.get("async/push_bytes") for r in history] == [adapters, None, None]
    assert history[0]["async/rollout_fingerprint"] != history[0]["async/push_fingerprint"]
    # update 2 rolled out with version 1 by vLLM: its log-probs are that version's (at fp32 rounding)
    assert history[0]["rollout/logprob_gap_max"] < GAP_FP32
