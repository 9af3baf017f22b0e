"""The shipped asynchronous GPU recipe (configs/qwen2.5-7b_seed_async_8xh100.yaml): `seedfast plan` gives what its
committed plan says (benchmarks/results/plan_7b_async_world7.json), both sides fit an 80 GB H100, and the placement
check accepts it on the node it is written for (8 GPUs, 7 trainer ranks) and refuses it on one it does not fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seedfast.cli import main
from seedfast.config import ConfigError, load_config
from seedfast.runtime.placement import check_placement

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "qwen2.5-7b_seed_async_8xh100.yaml"
PLAN = ROOT / "benchmarks" / "results" / "plan_7b_async_world7.json"
H100_GIB = 79.6  # what an H100 80GB reports to torch.cuda.mem_get_info


def test_the_committed_async_plan_is_what_the_plan_gives_and_both_sides_fit_an_h100(tmp_path):
    out = tmp_path / "plan.json"
    assert main(["plan", str(RECIPE), "--world", "7", "--json", str(out), f"run.out_dir={tmp_path}"]) == 0
    got, committed = json.loads(out.read_text()), json.loads(PLAN.read_text())
    assert {k: v for k, v in got.items() if k != "torch"} == {k: v for k, v in committed.items() if k != "torch"}
    assert got["world"] == 7 and got["rollout_side"]["devices"] == [7]
    assert got["gib"]["train_peak_checkpointing"] < H100_GIB
    assert got["rollout_side"]["gib"]["rollout_peak"] < H100_GIB


def test_the_async_recipe_is_placed_on_its_node_and_refused_where_it_does_not_fit():
    cfg = load_config(RECIPE)
    assert cfg.rollout.max_staleness >= 1 and cfg.rollout.devices == [7]
    check_placement(cfg, torch.device("cuda"), local_world=7, gpu_count=8)
    with pytest.raises(ConfigError, match=r"GPU\(s\) \[7\] are the trainer's"):
        check_placement(cfg, torch.device("cuda"), local_world=8, gpu_count=8)
    with pytest.raises(ConfigError, match=r"this node has 4 GPU\(s\), no GPU \[7\]"):
        check_placement(cfg, torch.device("cuda"), local_world=3, gpu_count=4)
