"""benchmarks/async_grid.py: a run's summary and the overlap bound by hand, the grid's order and its alternation, a
cell's ratios by hand, the vLLM engines refused before any run where vLLM is missing, and the whole script on the tiny
policy (one cell: both loops run with the same threads, the JSON holds each run's per-update records, the plot is
drawn)."""

import json

import pytest
import torch

from benchmarks import async_grid


def test_summary_by_hand():
    rows = [{"step": 0, "time/step": 6.0, "train/success_rate": 0.0, "time/rollout_wait": 5.0},
            {"step": 1, "time/step": 2.0, "train/success_rate": 0.5, "time/rollout_wait": 1.0},
            {"step": 2, "time/step": 4.0, "train/success_rate": 1.0, "time/rollout_wait": 0.0}]
    s = async_grid.summarize("m", rows)
    assert s["loop_s"] == 12.0 and s["updates_per_min"] == 15.0  # 3 updates in 12 s
    assert s["updates_per_min_after_first"] == 20.0  # 2 updates in 6 s
    assert s["pool_success_mean"] == 0.5 and s["wait_s_mean"] == 2.0


def test_the_overlap_bound_by_hand():
    rows = [{"time/rollout": 9.0, "time/step": 10.0},  # the first update: left out
            {"time/rollout": 2.0, "time/step": 8.0}, {"time/rollout": 4.0, "time/step": 12.0}]
    share, bound = async_grid.overlap_bound(rows)
    assert share == 0.3 and bound == 1 / 0.7  # 6 s of rollout in 20 s; the rest, 70%, bounds the overlap


def test_the_grid_runs_engine_then_delay_then_seed_and_alternates_the_order():
    got = async_grid.cells(["own", "vllm-eager"], [0.0, 0.05], [0, 1])
    assert [(c["engine"], c["delay_s"], c["seed"]) for c in got[:4]] == [
        ("own", 0.0, 0), ("own", 0.0, 1), ("own", 0.05, 0), ("own", 0.05, 1)]
    assert len(got) == 8 and got[4]["engine"] == "vllm-eager"
    assert [c["async_first"] for c in got] == [False, True] * 4


def test_a_cells_ratios_by_hand():
    sync = [{"step": 0, "time/step": 10.0, "time/rollout": 4.0, "train/success_rate": 0.25},
            {"step": 1, "time/step": 10.0, "time/rollout": 4.0, "train/success_rate": 0.75}]
    stale = [{"step": 0, "time/step": 12.0, "time/rollout_wait": 2.0, "train/success_rate": 0.25},
             {"step": 1, "time/step": 8.0, "time/rollout_wait": 0.0, "train/success_rate": 0.25}]
    s = async_grid.cell_summary(sync, stale)
    assert s["speedup"] == 1.0  # 2 updates in 20 s on both sides
    assert s["speedup_after_first"] == 10.0 / 8.0
    assert s["rollout_share"] == 0.4 and s["overlap_bound"] == 1 / 0.6
    assert s["success_difference"] == 0.25 - 0.5


def test_vllm_engines_are_refused_before_any_run_without_vllms_venv(tmp_path):
    with pytest.raises(SystemExit, match="no vLLM venv"):
        async_grid.check_engines(["own", "vllm-compiled"], tmp_path / "missing" / "python")
    async_grid.check_engines(["own"], tmp_path / "missing" / "python")


def test_the_script_runs_one_cell_both_ways(overrides, train_games, tiny_policy, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(async_grid, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(async_grid, "write_results",
                        lambda name, result: (tmp_path / f"{name}.json").write_text(json.dumps(result)) or
                        tmp_path / f"{name}.json")
    before = torch.get_num_threads()
    tiny = [o for o in overrides(train_games, tmp_path) if not o.startswith(("run.", "trainer.steps"))]
    try:
        assert async_grid.main(["--policy", str(tiny_policy), "--games-dir", str(train_games), "--steps", "2",
                                "--delays", "0.01", "--seeds", "3", "--threads", "2", "--name", "g",
                                "--work", str(tmp_path / "runs"), "--set", *tiny]) == 0
    finally:
        torch.set_num_threads(before)
    result = json.loads((tmp_path / "g.json").read_text())
    assert result["threads"] == {"total": 2, "trainer": 1, "producer": 1}
    assert result["cells_planned"] == 1
    (cell,) = result["cells"]
    assert (cell["engine"], cell["delay_s"], cell["seed"]) == ("own", 0.01, 3)
    assert "run.seed=3" in cell["overrides"] and "env.step_delay_s=0.01" in cell["overrides"]
    assert [r["rollout/staleness_mean"] for r in cell["runs"]["asynchronous"]] == [0.0, 1.0]
    assert all("rollout/staleness_mean" not in r for r in cell["runs"]["synchronous"])
    s = cell["summary"]
    assert s["speedup"] == pytest.approx(s["asynchronous"]["updates_per_min"] / s["synchronous"]["updates_per_min"])
    assert (tmp_path / "g.png").stat().st_size > 0
    text = async_grid.markdown({**result, "benchmark": "g", "command": "python -m benchmarks.async_grid",
                                "machine": {"cpu": "a CPU", "cpu_count": 2}})
    assert "1 of 1 planned cells" in text and "| own engine | 10 | 3 |" in text
    assert f"{s['speedup']:.2f}x" in text


def test_the_read_out_says_when_engines_repeat_a_seeds_learning_curves():
    def cell(engine, seed, difference):
        run = {"updates_per_min": 10.0, "pool_success_mean": 0.5}
        rows = [{"time/update": 1.0}]
        return {"engine": engine, "delay_s": 0.0, "seed": seed,
                "runs": {"synchronous": rows, "asynchronous": rows},
                "summary": {"synchronous": run, "asynchronous": run, "speedup": 1.0, "speedup_after_first": 1.0,
                            "overlap_bound": 1.5, "success_difference": difference}}

    result = {"benchmark": "g", "command": "c", "machine": {"cpu": "a CPU", "cpu_count": 2},
              "threads": {"total": 2, "trainer": 1, "producer": 1}, "cells_planned": 4,
              "config": {"algorithm": "grpo", "steps": 2, "staleness": 1}, "env": {"env_step_s_mean": 0.001}}
    same = [cell("own", 0, -0.1), cell("vllm-eager", 0, -0.1), cell("own", 1, 0.2), cell("vllm-eager", 1, 0.2)]
    text = async_grid.markdown({**result, "cells": same}).replace("\n", " ")
    assert "holds 2 distinct pairs of learning curves in 4 cells: at a seed the episodes were the same" in text
    assert "own engine and vLLM eager drew the same ones" in text
    other = [*same[:3], cell("vllm-eager", 1, 0.3)]
    assert "drew the same" not in async_grid.markdown({**result, "cells": other}).replace("\n", " ")
    own = [same[0], same[2]]
    assert "pairs of learning curves" not in async_grid.markdown({**result, "cells": own})


def test_the_trainers_cost_by_hand():
    def cell(speedup, sync_update, async_update, share):
        return {"engine": "own", "delay_s": 0.0, "seed": 0,
                "runs": {"synchronous": [{"time/update": 9.0}, {"time/update": sync_update}],  # update 0 left out
                         "asynchronous": [{"time/update": 9.0}, {"time/update": async_update}]},
                "summary": {"speedup": speedup, "rollout_share": share}}

    text = async_grid.trainer_cost([cell(0.8, 1.0, 2.0, 0.3), cell(1.2, 2.0, 3.0, 0.5)], {"trainer": 1, "total": 2})
    assert "took 1.50 s in the synchronous loop and 2.50 s in the asynchronous one" in text
    assert "(own engine +0 ms: r = 0.30)" in text and text.endswith("the asynchronous loop is the slower.")
    assert "slower" not in async_grid.trainer_cost([cell(1.2, 2.0, 3.0, 0.5)], {"trainer": 1, "total": 2})
