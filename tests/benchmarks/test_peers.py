"""benchmarks/peers.py compares like with like: from the same weights and step samples, the reference recipe
(transformers model, materialized logits, teacher re-forward, the loss of docs/algorithms.md written out again) and
seedfast's update path give the same loss, the same clipped gradients and the same updated weights (fp32)."""

from pathlib import Path

import pytest
import torch

from benchmarks import peers

BATCH = dict(tasks=2, trajectories=4, prompt=64, skill=8, response=6)
TOL = 1e-4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return peers.write_checkpoint(peers.model_config("tiny", 2), tmp_path_factory.mktemp("peers") / "hf")


def one_update(leg: str, algo: str, ckpt: Path, insertion: str,
               checkpointing: bool = False) -> tuple[float, dict, dict]:
    """(loss, clipped grads, updated weights) of one update of `leg` from the checkpoint."""
    torch.manual_seed(0)
    hp = peers.hyper_params()
    policy, ref = peers.load_models(leg, ckpt, "cpu", "fp32", checkpointing)
    optimizer = peers.make_optimizer(policy, hp, leg)
    samples = peers.make_samples(BATCH, peers.SHAPES["tiny"]["model"]["vocab_size"], insertion)
    loss = peers.make_update(leg, algo, policy, ref, optimizer, samples, hp, "cpu")(peers.Phases())
    grads = {n: p.grad.detach().clone() for n, p in policy.named_parameters()}
    weights = {n: p.detach().clone() for n, p in policy.named_parameters()}
    return loss, grads, weights


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("algo", peers.ALGOS)
@pytest.mark.parametrize("insertion", ["before_response", "after_task"])
def test_seedfast_matches_the_reference_recipe(checkpoint, algo, insertion):
    ref_loss, ref_grads, ref_weights = one_update("reference", algo, checkpoint, insertion)
    loss, grads, weights = one_update("seedfast", algo, checkpoint, insertion)
    assert abs(loss - ref_loss) <= TOL
    # the gradients are the meaningful check: at lr 1e-6 any two AdamW steps differ by at most ~2e-6
    assert max(float(g.abs().max()) for g in ref_grads.values()) > 1e-3
    assert max_diff(grads, ref_grads) <= TOL
    assert max_diff(weights, ref_weights) <= TOL


def test_liger_matches_the_reference_recipe(checkpoint):
    pytest.importorskip("liger_kernel.chunked_loss")
    ref_loss, ref_grads, _ = one_update("reference", "seed", checkpoint, "before_response")
    loss, grads, _ = one_update("liger", "seed", checkpoint, "before_response")
    assert abs(loss - ref_loss) <= TOL
    assert max_diff(grads, ref_grads) <= TOL


def test_samples_carry_a_win_a_loss_and_a_failed_skill():
    samples = peers.make_samples(BATCH, 100, "after_task")
    assert len(samples) == BATCH["tasks"] * BATCH["trajectories"]
    for g in range(BATCH["tasks"]):
        rewards = {s["reward"] for s in samples if s["group"] == g}
        assert rewards >= {0.0, 1.0}
    assert not all(s["skill_valid"] for s in samples)
    assert all(0 <= s["k"] < len(s["prompt"]) for s in samples)


@pytest.mark.parametrize("leg", ["reference", "seedfast"])
def test_activation_checkpointing_recomputes_the_same_update(checkpoint, leg):
    """--checkpointing switches each side's own activation checkpointing on; the update is the same one."""
    ref_loss, ref_grads, _ = one_update("reference", "seed", checkpoint, "before_response")
    policy, _ = peers.load_models(leg, checkpoint, "cpu", "fp32", checkpointing=True)
    assert policy.gradient_checkpointing if leg == "seedfast" else policy.is_gradient_checkpointing
    loss, grads, _ = one_update(leg, "seed", checkpoint, "before_response", checkpointing=True)
    assert abs(loss - ref_loss) <= TOL
    assert max_diff(grads, ref_grads) <= TOL


def test_each_depth_and_checkpointing_has_its_own_entry():
    def key(*argv):
        return peers.result_key(peers.parse_args(["--shape", "qwen0.5b", *argv]))

    assert key() == "qwen0.5b"
    assert key("--layers", "2") == "qwen0.5b_2layers"
    assert key("--layers", "24", "--checkpointing") == "qwen0.5b_ckpt"
    assert key("--layers", "2", "--opd-modes", "gate", "jsd") == peers.OPD_MODES_ENTRY


def test_each_opd_mode_runs_its_own_teacher_term(checkpoint):
    """--opd-modes: the seedfast leg's update with each loss.opd_mode; the forms give different updates (the same
    GRPO part, another teacher term), and the same form twice the same one."""
    updates = {}
    for mode in peers.OPD_MODES:
        torch.manual_seed(0)
        hp = peers.hyper_params()
        policy, ref = peers.load_models("seedfast", checkpoint, "cpu", "fp32")
        optimizer = peers.make_optimizer(policy, hp, "seedfast")
        samples = peers.make_samples(BATCH, peers.SHAPES["tiny"]["model"]["vocab_size"], "before_response")
        loss = peers.make_update("seedfast", "seed", policy, ref, optimizer, samples, hp, "cpu", mode)(peers.Phases())
        updates[mode] = (loss, {n: p.grad.detach().clone() for n, p in policy.named_parameters()})
    assert updates["gate"][0] == one_update("seedfast", "seed", checkpoint, "before_response")[0]
    modes = list(updates)
    for i, a in enumerate(modes):
        for b in modes[i + 1:]:
            assert max_diff(updates[a][1], updates[b][1]) > 0, (a, b)


def test_opd_modes_table_reads_its_entry():
    entry = {"model": peers.model_config("qwen0.5b", 2), "samples": 8, "device": "cpu", "dtype": "fp32",
             "opd_modes": [{"opd_mode": "gate", "phases_s": {"total": 8.0}, "peak_extra_bytes": 2 << 30,
                            "time_vs_gate": 1.0, "memory_vs_gate": 1.0},
                           {"opd_mode": "jsd", "phases_s": {"total": 9.0}, "peak_extra_bytes": 3 << 30,
                            "time_vs_gate": 1.125, "memory_vs_gate": 1.5}]}
    table = peers.opd_modes_table({"shapes": {peers.OPD_MODES_ENTRY: entry}})
    assert "| `loss.opd_mode=jsd` | 9.0 s | 1.12× | 3.00 GiB | 1.50× |" in table
