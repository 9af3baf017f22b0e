"""The RL loop (train/rl.py Trainer, rollout.engine=vllm) against the REAL vLLM on its CPU back end (`make test-vllm`),
checking what tests/train/test_vllm_in_loop.py checks with the stand-in: every step pushes the policy's weights
(layerwise reload, checksum and probe verify) before the rollout, and the train-vs-rollout log-prob gap
(rollout/logprob_gap_*, from the log-probs vLLM sampled each token with) stays at fp32 rounding after updates that
move the weights. A push that never reaches vLLM shows in that gap from the first update on (verify off), and the
verify stops it (on); so does a push that leaves the tied LM head's packed copy stale, the CPU back end's own way of
computing with old weights. TextWorld games and an SFT'd tiny policy as in tests/train (tests/conftest.py), with
heads of 32 (vLLM's CPU attention needs head_dim >= 32). Skipped without vllm or textworld."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")
pytest.importorskip("textworld")

from seedfast.config import load_config  # noqa: E402
from seedfast.distributed.weight_push import hf_named_tensors  # noqa: E402
from seedfast.rollout.colocated import VLLMRollout  # noqa: E402
from seedfast.train.rl import Trainer  # noqa: E402
from tests.vllm_real.vllm_helpers import GAP_FP32, PUSH_RPCS, SMALL_ENGINE, STEPS  # noqa: E402

pytestmark = pytest.mark.usefixtures("small_engine")


def _train(overrides, policy: Path, games: Path, out: Path, *extra: str,
           patch: Callable[[VLLMRollout], None] | None = None) -> tuple[Trainer, list[dict[str, Any]], float]:
    """STEPS steps of GRPO with rollout.engine=vllm; `patch` sees the rollout engine before the first step.
    Returns the trainer, the metrics of each step and the policy's parameters' largest move over the run."""
    cfg = load_config(None, [*overrides(games, out), f"model.path={policy}", "rollout.engine=vllm",
                             "rollout.sync_bucket_mb=1", "algorithm=grpo", f"trainer.steps={STEPS}",
                             "trainer.checkpoint_every=0", "optim.lr=1e-2", *SMALL_ENGINE, *extra], command="train")
    trainer = Trainer(cfg, policy_dir=policy)
    try:
        assert isinstance(trainer.engine, VLLMRollout)
        vllm_config = trainer.engine.engine.llm.llm_engine.vllm_config  # the options reached the real engine
        assert vllm_config.model_config.enforce_eager and vllm_config.scheduler_config.max_num_seqs == 8
        start = [p.detach().clone() for p in trainer.policy.parameters()]
        if patch is not None:
            patch(trainer.engine)
        history = trainer.run()
        moved = max(float((p.detach() - s).abs().max()) for p, s in zip(trainer.policy.parameters(), start))
        return trainer, history, moved
    finally:
        trainer.close()  # shuts the engine's core process down now (one engine at a time on 2 cores)


def _intercept(rollout: VLLMRollout, edit: Callable[[str, tuple], tuple | None], calls: list[str]) -> None:
    """Route the engine's RPCs to vLLM through `edit(method, args)`: new args, or None to drop the call (the
    sender sees one worker that answered nothing); each method sent is appended to `calls`."""
    send = rollout.llm.collective_rpc

    def rpc(method: str, *args: Any, **kwargs: Any) -> list[Any]:
        new = edit(method, kwargs.get("args", ()))
        if new is None:
            return [None]
        calls.append(method)
        return send(method, *args, **{**kwargs, "args": new})

    rollout.llm.collective_rpc = rpc


def _lose_pushes(rollout: VLLMRollout, calls: list[str]) -> None:
    """Every push is lost on its way: vLLM keeps the weights it loaded from the policy's folder."""
    _intercept(rollout, lambda method, args: None if method in PUSH_RPCS else args, calls)


def _stale_lm_head(rollout: VLLMRollout, calls: list[str]) -> None:
    """Every push reloads the layers but not the packed copy the tied LM head's logits come from."""
    _intercept(rollout, lambda method, args: (False,) if method == "seedfast_end_reload" else args, calls)


def test_each_step_pushes_and_the_gap_stays_at_rounding(overrides, policy32, train_games, tmp_path):
    trainer, history, moved = _train(overrides, policy32, train_games, tmp_path)
    assert trainer.engine.sleep is False  # vLLM's CPU back end has no sleep mode: the engine stays awake
    assert moved > 1e-3  # the updates move the weights the engine must follow
    n_tensors = len(list(hf_named_tensors(trainer.policy)))  # every tensor, every step
    assert len(history) == STEPS
    for row in history:
        assert row["sync/tensors"] == n_tensors and row["sync/buckets"] >= 1 and row["sync/bytes"] > 0
        assert row["rollout/logprob_gap_mean"] <= row["rollout/logprob_gap_max"] < GAP_FP32, row
    print("gap max per step:", [row["rollout/logprob_gap_max"] for row in history],
          "mean:", [row["rollout/logprob_gap_mean"] for row in history])


def test_a_lost_push_shows_in_the_log_prob_gap(overrides, policy32, train_games, tmp_path):
    calls: list[str] = []

    def lose_unverified(rollout: VLLMRollout) -> None:
        rollout.verify = False
        _lose_pushes(rollout, calls)

    _, history, _ = _train(overrides, policy32, train_games, tmp_path, patch=lose_unverified)
    assert not set(PUSH_RPCS) & set(calls)  # nothing of a push reached vLLM
    gaps = [row["rollout/logprob_gap_max"] for row in history]
    print("gap max per step, pushes lost:", gaps)
    assert gaps[0] < GAP_FP32  # before any update vLLM's copy (loaded from the folder) is the policy
    assert min(gaps[1:]) > 10 * GAP_FP32, gaps  # after it, vLLM samples with stale weights


@pytest.mark.parametrize("break_push, message", [
    (_lose_pushes, r"vLLM weight sync failed: \S+ sums to"),
    (_stale_lm_head, r"vLLM weight sync failed: model\.embed_tokens\.weight#probe sums to"),
], ids=["lost", "stale_lm_head"])
def test_the_verify_stops_a_push_that_did_not_take_effect(overrides, policy32, train_games, tmp_path,
                                                          break_push, message):
    calls: list[str] = []
    with pytest.raises(RuntimeError, match=message):
        _train(overrides, policy32, train_games, tmp_path, patch=lambda rollout: break_push(rollout, calls))
    # step 0's verify passed (vLLM's copy is the policy before any update); step 1's, after the first update, failed
    assert calls.count("seedfast_weight_sums") == 2, calls
