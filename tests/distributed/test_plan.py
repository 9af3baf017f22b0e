"""`seedfast plan`: the real sharding over a fake process group gives, per GPU, what hand arithmetic gives
(parameters x bytes / shards), at the three shapes of docs/scaling.md; bad input names its key."""

from __future__ import annotations

import json
import math

import pytest

from seedfast.cli import main
from seedfast.config import ConfigError, load_config
from seedfast.distributed.plan import GIB, QWEN25, memory_plan
from tests.distributed.plan_helpers import hand_parameters as _hand

CONFIG = "configs/qwen2.5-7b_alfworld_8xh100.yaml"
# (shape, world, tp, parameters as the model pages on the Hugging Face hub round them, in billions)
SHAPES = [("Qwen2.5-7B", 8, 1, 7.62), ("Qwen2.5-32B", 32, 8, 32.8), ("Qwen2.5-72B", 32, 8, 72.7)]


@pytest.mark.parametrize("name,world,tp,billions", SHAPES)
def test_plan_matches_hand_arithmetic(name, world, tp, billions):
    cfg = load_config(CONFIG, [f"model.path=models/{name}-Instruct", "dist.strategy=fsdp", f"dist.tp={tp}",
                               "rollout.engine=own"])
    plan = memory_plan(cfg, world)
    total, local = _hand(QWEN25[name], tp)
    assert plan.params_total == total
    assert round(plan.params_total / 1e9, 1 if billions > 10 else 2) == billions
    assert (plan.dp_shard, plan.tp) == (world // tp, tp)
    hand_bytes = local * 4 / plan.dp_shard  # fp32 master weights, FSDP2 over dp_shard ranks
    got = plan.gib["parameters"] * GIB
    # FSDP2 pads each parameter's dim 0 to a multiple of dp_shard: at most dp_shard - 1 rows per parameter
    assert hand_bytes <= got * (1 + 1e-4) and got <= hand_bytes * 1.002 + 1e5
    assert plan.gib["gradients"] == plan.gib["parameters"]
    assert plan.gib["optimizer_states"] == pytest.approx(2 * plan.gib["parameters"], abs=2e-4)
    # what computes is bf16: a gathered decoder block (TP-local), and the root's unsharded gradient cast to fp32
    # for the reduce-scatter
    assert (plan.compute_dtype, plan.master_dtype, plan.reduce_dtype) == ("bf16", "fp32", "fp32")
    root = QWEN25[name]["vocab_size"] * QWEN25[name]["hidden_size"] * (1 if QWEN25[name]["tie_word_embeddings"]
                                                                       else 2) // tp + QWEN25[name]["hidden_size"]
    assert plan.gib["gathered_root_and_its_grad"] == pytest.approx(2 * root * 2 / GIB, rel=1e-3)
    assert plan.gib["reduce_scatter_copy"] == pytest.approx(root * 4 / GIB, rel=1e-3)
    # the logits the fused ops never form: micro_batch_tokens x V/tp fp32
    vocab = QWEN25[name]["vocab_size"]
    assert plan.gib["logits_avoided_fp32"] == pytest.approx(32768 * math.ceil(vocab / tp) * 4 / GIB, abs=1e-4)


def test_plan_command_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = main(["plan", CONFIG, "--world", "8", "--json", str(out), "model.path=models/Qwen2.5-7B-Instruct",
               "rollout.engine=own", f"run.out_dir={tmp_path}"])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["model"] == "Qwen2.5-7B" and data["world"] == 8
    assert "activations_checkpointing" in capsys.readouterr().out


@pytest.mark.parametrize("override,key", [("dist.tp=3", "dist.tp"), ("dist.tp=8", "num_attention_heads"),
                                          ("dist.dp_shard=3", "dist.dp_shard")])
def test_plan_refuses_a_mesh_that_does_not_fit(override, key):
    cfg = load_config(CONFIG, ["model.path=models/Qwen2.5-7B-Instruct", "dist.strategy=fsdp", override])
    with pytest.raises(ConfigError, match=key):
        memory_plan(cfg, 8)


def test_plan_with_rollout_gpus_of_their_own_prints_both_sides(tmp_path, capsys):
    """rollout.devices: the trainer's GPUs plan no rollout, and the producer's side is, per rollout GPU, the whole
    model / rollout tp, up to max_staleness whole staged versions on the first GPU, and the whole batch's KV cache
    / rollout tp, in the engine's dtype (hand arithmetic from Qwen2.5-7B's published shape)."""
    out = tmp_path / "plan.json"
    rc = main(["plan", CONFIG, "--world", "6", "--json", str(out), "model.path=models/Qwen2.5-7B-Instruct",
               "rollout.engine=vllm", "rollout.tensor_parallel=2", "rollout.devices=6-7", "rollout.max_staleness=2",
               "rollout.vllm_dtype=bf16", "dist.strategy=fsdp", f"run.out_dir={tmp_path}"])
    assert rc == 0
    data = json.loads(out.read_text())
    assert "rollout_peak" not in data["gib"] and "rollout_kv_cache" not in data["gib"]
    side = data["rollout_side"]
    assert side["devices"] == [6, 7] and side["tp"] == 2 and side["dtype"] == "bf16"
    shape = QWEN25["Qwen2.5-7B"]
    total, _ = _hand(shape, 1)
    cfg = load_config(CONFIG, [])
    rows = cfg.rollout.tasks_per_batch * cfg.rollout.n
    tokens = cfg.rollout.max_prompt_length + cfg.rollout.max_response_tokens
    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    kv = rows * tokens * 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * head_dim * 2
    assert side["rows"] == rows and side["tokens_per_row"] == tokens
    assert side["gib"]["rollout_weights"] == pytest.approx(total * 2 / 2 / GIB, abs=1e-4)
    assert side["gib"]["staged_versions"] == pytest.approx(2 * total * 2 / GIB, abs=1e-4)
    assert side["gib"]["rollout_kv_cache"] == pytest.approx(kv / 2 / GIB, abs=1e-4)
    printed = capsys.readouterr().out
    assert "rollout on GPUs [6, 7] of their own (vllm engine, tp=2" in printed


@pytest.mark.parametrize("overrides,match", [
    (["rollout.devices=6"], "rollout.max_staleness >= 1"),
    (["rollout.devices=6-7", "rollout.max_staleness=1", "rollout.engine=own"], "the own engine's one"),
])
def test_plan_refuses_a_placement_that_does_not_hold(overrides, match, capsys):
    assert main(["plan", CONFIG, "--world", "6", "model.path=models/Qwen2.5-7B-Instruct", *overrides]) == 2
    err = capsys.readouterr().err
    assert "seedfast plan: config error: rollout.devices=" in err and match in err
