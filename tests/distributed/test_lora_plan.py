"""`seedfast plan` with LoRA: per GPU, the frozen base at model.dtype bytes per parameter over its shards, the adapters
(placed as tensor parallel places them: distributed/parallelize.py ADAPTER_PLACEMENTS) at fp32 with their gradients
and AdamW's two moments (8 bytes per adapter parameter), no master copy; what hand arithmetic gives from the published
Qwen2.5 shapes. The committed LoRA plans of the 7B/32B/72B recipes (benchmarks/results/plan_*_lora_r32.json) are what
the plan gives today."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seedfast.cli import main
from seedfast.config import load_config
from seedfast.distributed.plan import GIB, QWEN25, memory_plan
from tests.distributed.plan_helpers import hand_parameters as _hand

ROOT = Path(__file__).resolve().parents[2]
RANK = 32
# (recipe, world, committed plan without LoRA, with LoRA at rank 32)
RECIPES = [("qwen2.5-7b_seed_8xh100.yaml", 8, "plan_7b_world8_tp1"),
           ("qwen2.5-32b_seed_4x8xh100.yaml", 32, "plan_32b_world32_tp4"),
           ("qwen2.5-72b_seed_4x8xh100.yaml", 32, "plan_72b_world32_tp8")]


def _hand_adapters(shape: dict, r: int, tp: int) -> tuple[int, int]:
    """(adapter parameters of all 7 projections of every layer, those one rank of a tp-way group holds):
    column-parallel q/k/v/gate/up keep A [r, d] whole and split B [out, r]; row-parallel o/down split A [r, in]
    and keep B [d, r] whole."""
    d, inter, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kv = shape["num_key_value_heads"] * d // shape["num_attention_heads"]
    colwise = [d, kv, kv, inter, inter]  # output rows of q, k, v, gate, up (input: d)
    rowwise = [d, inter]  # input columns of o, down (output: d)
    total = layers * r * (sum(d + out for out in colwise) + sum(d + inp for inp in rowwise))
    local = layers * r * (sum(d + out // tp for out in colwise) + sum(inp // tp + d for inp in rowwise))
    return total, local


@pytest.mark.parametrize("config,world,_name", RECIPES)
def test_lora_plan_matches_hand_arithmetic(config, world, _name):
    cfg = load_config(ROOT / "configs" / config, [f"model.lora.rank={RANK}"])
    plan, full = memory_plan(cfg, world), memory_plan(load_config(ROOT / "configs" / config, []), world)
    shape = QWEN25[plan.model]
    total_base, local_base = _hand(shape, plan.tp)
    total_adapters, local_adapters = _hand_adapters(shape, RANK, plan.tp)
    assert plan.params_total == full.params_total == total_base  # the base's count, as without LoRA
    assert plan.lora == {"rank": RANK, "alpha": 32.0, "targets": list(cfg.model.lora.targets),
                         "adapter_params_total": total_adapters}
    gib = plan.gib
    # the frozen base: model.dtype (bf16) bytes per parameter over dp_shard shards (FSDP2 pads dim 0 a little)
    base = local_base * 2 / plan.dp_shard
    assert base <= gib["frozen_base"] * GIB * (1 + 1e-4) and gib["frozen_base"] * GIB <= base * 1.002 + 1e5
    # the adapters: fp32 masters, fp32 gradients, AdamW's two fp32 moments: 8 bytes per adapter parameter
    adapters = local_adapters * 4 / plan.dp_shard
    assert gib["adapters"] * GIB == pytest.approx(adapters, rel=1e-3)
    assert gib["gradients"] == gib["adapters"]
    assert gib["optimizer_states"] * GIB == pytest.approx(local_adapters * 8 / plan.dp_shard, rel=1e-3)
    assert gib["parameters"] == pytest.approx(gib["frozen_base"] + gib["adapters"], abs=2e-4)
    # the root is frozen: gathered without a gradient, half of full fine-tuning's
    assert gib["gathered_root_and_its_grad"] == pytest.approx(full.gib["gathered_root_and_its_grad"] / 2, abs=2e-4)
    # against full fine-tuning: no fp32 master of the base, no gradients and moments of it
    assert gib["parameters"] < full.gib["parameters"] / 1.9
    assert gib["train_peak_checkpointing"] < full.gib["train_peak_checkpointing"] - 3 * full.gib["parameters"]


@pytest.mark.parametrize("config,world,name", RECIPES)
def test_the_committed_lora_plans_are_what_the_plan_gives(config, world, name, tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", f"configs/{config}", "--world", str(world), "--json", str(out), f"model.lora.rank={RANK}",
                 f"run.out_dir={tmp_path}"]) == 0
    assert f"LoRA adapters (rank {RANK}" in capsys.readouterr().out
    got = json.loads(out.read_text())
    committed = json.loads((ROOT / "benchmarks" / "results" / f"{name}_lora_r{RANK}.json").read_text())
    assert {k: v for k, v in got.items() if k != "torch"} == {k: v for k, v in committed.items() if k != "torch"}
    without = json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text())
    assert got["gib"]["train_peak_checkpointing"] < without["gib"]["train_peak_checkpointing"]
