"""benchmarks/async_grid.py: the grid's order and its alternation, a cell's ratios by hand, the vLLM engines refused
before any run where vLLM is missing, and the whole script on the tiny policy (one cell: both loops run with the same
threads, the JSON holds each run's per-update records, the plot is drawn)."""

import json

import pytest
import torch

from benchmarks import async_grid


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
