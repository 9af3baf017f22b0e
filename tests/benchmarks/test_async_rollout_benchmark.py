"""benchmarks/async_rollout.py: its summary by hand, and the whole script on the tiny policy (both modes run, the JSON
holds each update's success and the staleness, the plot is drawn)."""

import json

import pytest

from benchmarks import async_rollout


def test_summary_by_hand():
    rows = [{"step": 0, "time/step": 6.0, "train/success_rate": 0.0, "time/rollout_wait": 5.0},
            {"step": 1, "time/step": 2.0, "train/success_rate": 0.5, "time/rollout_wait": 1.0},
            {"step": 2, "time/step": 4.0, "train/success_rate": 1.0, "time/rollout_wait": 0.0}]
    s = async_rollout.summarize("m", rows)
    assert s["loop_s"] == 12.0 and s["updates_per_min"] == 15.0  # 3 updates in 12 s
    assert s["updates_per_min_after_first"] == 20.0  # 2 updates in 6 s
    assert s["pool_success_mean"] == 0.5 and s["wait_s_mean"] == 2.0


def test_the_overlap_bound_by_hand():
    rows = [{"time/rollout": 9.0, "time/step": 10.0},  # the first update: left out
            {"time/rollout": 2.0, "time/step": 8.0}, {"time/rollout": 4.0, "time/step": 12.0}]
    share, bound = async_rollout.overlap_bound(rows)
    assert share == 0.3 and bound == 1 / 0.7  # 6 s of rollout in 20 s; the rest, 70%, bounds the overlap


def test_the_script_runs_both_modes(overrides, train_games, tiny_policy, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(async_rollout, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(async_rollout, "write_results",
                        lambda name, result: (tmp_path / f"{name}.json").write_text(json.dumps(result)) or
                        tmp_path / f"{name}.json")
    tiny = [o for o in overrides(train_games, tmp_path) if not o.startswith(("run.", "trainer.steps"))]
    assert async_rollout.main(["--policy", str(tiny_policy), "--games-dir", str(train_games), "--steps", "2",
                               "--name", "t", "--work", str(tmp_path / "runs"), "--step-delay", "0.01",
                               "--set", *tiny]) == 0
    result = json.loads((tmp_path / "t.json").read_text())
    assert list(result["runs"]) == ["synchronous", "max_staleness=1"]
    assert [r["rollout/staleness_mean"] for r in result["runs"]["max_staleness=1"]] == [0.0, 1.0]
    assert all("rollout/staleness_mean" not in r for r in result["runs"]["synchronous"])
    assert result["env"]["env_step_s_mean"] > 0 and (tmp_path / "t.png").stat().st_size > 0
