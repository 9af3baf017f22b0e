"""`seedfast demo` end to end at a tiny size: its report's held-out numbers are the evaluation every command
shares, so `seedfast eval` of the SFT policy and of an exported RL policy gives exactly the numbers the demo's
summary holds (no second evaluation path with its own seed or repeats; docs/demo.md)."""

from __future__ import annotations

import json

from seedfast import cli
from seedfast.app import demo
from seedfast.config import load_config
from seedfast.runtime.paths import RunPaths

DEMO = ["demo.algorithms=[grpo]", "sft.copy_warmup_steps=0", "trainer.steps=1", "env.n_eval=1",
        "trainer.eval_repeats=2", "rollout.eval_temperature=1.0", "rollout.max_response_tokens=16"]


def _seedfast_eval(overrides: list[str], policy, run_name: str) -> dict[str, float]:
    assert cli.main(["eval", *overrides, f"trainer.init_from={policy}", f"run.name={run_name}"]) == 0
    cfg = load_config(None, [*overrides, f"run.name={run_name}"])
    return json.loads(RunPaths.of(cfg).eval("eval").read_text())


def test_the_demo_reports_what_seedfast_eval_measures(overrides, train_games, tmp_path):
    args = [*overrides(train_games, tmp_path), *DEMO]
    cfg = load_config(None, args)
    assert demo.main(cfg) == 0
    paths = RunPaths.of(cfg)
    summary = json.loads(paths.demo_summary.read_text())
    assert "1 held-out (each played 2 times per evaluation)" in summary["setup"]["games"]
    assert summary["held_out"] == {"games": 1, "plays": 2}
    assert summary["temperatures"] == {"held_out": 1.0, "pool": cfg.rollout.temperature}
    sft_log = [json.loads(line) for line in paths.sft_metrics.read_text().splitlines()]
    phases = summary["sft_phases"]  # SFT's own log's phases: no copy warm-up here
    assert phases["data"] == sft_log[0]["wall_s"] and phases["steps"] == sft_log[-1]["elapsed_s"]
    assert phases["copy_warmup"] == phases["copy_warmup_steps"] == 0
    assert phases["data"] + phases["steps"] <= summary["timings"]["sft"]
    # the wall time by phase and the lanes' schedule: every job's start (after the jobs phase began) and length
    jobs = {"grpo", "control", "eval_sft"}
    assert set(summary["job_seconds"]) == set(summary["job_start_s"]) == jobs
    assert all(0 <= summary["job_start_s"][j] < summary["timings"]["after_sft"] for j in jobs)
    assert all(summary["job_start_s"][j] + summary["job_seconds"][j] <= summary["timings"]["after_sft"] for j in jobs)

    before = _seedfast_eval(args, paths.sft, "eval_sft")
    after = _seedfast_eval(args, paths.sub("grpo").hf, "eval_grpo")
    for key, value in summary["before"].items():
        assert before[key] == value, key
    for key, value in summary["after"]["grpo"].items():
        assert after[key] == value, key
    assert set(summary["after"]["grpo"]) >= {"eval/success_rate", "eval/invalid_rate", "eval/episode_length"}
