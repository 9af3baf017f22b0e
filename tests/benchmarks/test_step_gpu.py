"""benchmarks/step_gpu.py runs end to end on CPU at the tiny shape (so a GPU window is not lost to a crash), counts
the tokens of each phase from the batch, and its FLOP count is the hand arithmetic."""

import json
import math

import pytest

from benchmarks import step_gpu


def test_tiny_cpu_run_writes_both_algorithms(tmp_path):
    out = tmp_path / "step_gpu.json"
    step_gpu.main(["--shape", "tiny", "--device", "cpu", "--reps", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    b = step_gpu.BATCHES["tiny"]
    trajectories = b["tasks"] * b["trajectories"]
    rows = {r["algorithm"]: r for r in result["rows"]}
    assert set(rows) == {"grpo", "seed"}
    assert result["peak_bf16_flops"] is None  # no MFU claimed off a GPU
    for algo, row in rows.items():
        assert math.isfinite(row["loss"]) and row["step_s"] > 0 and row["step_mfu"] is None
        ph = row["phases"]
        assert ph["rollout"]["tokens"] == trajectories * b["response"]
        assert ph["update"]["tokens"] == ph["ref"]["tokens"] == trajectories * (b["prompt"] + b["response"])
        assert ph["analyze"]["tokens"] == (trajectories * b["skill"] if algo == "seed" else 0)
        assert ph["update"]["tokens_per_s"] > 0
    # the SEED update adds the teacher branch's forward to GRPO's 3 x forward
    assert rows["seed"]["phases"]["update"]["tflop"] > rows["grpo"]["phases"]["update"]["tflop"]
    assert rows["grpo"]["step_vs_grpo"] == 1.0
    assert result["partial"] is False and result["attn"] == "auto"


def test_json_is_written_after_each_algorithm_with_the_commit_passed_in(tmp_path, monkeypatch):
    # the GPU window's tree has no .git: the commit comes in; a step cut short still leaves the GRPO row on disk
    out = tmp_path / "step_gpu.json"
    seen = []
    real = step_gpu.write_json_atomic
    monkeypatch.setattr(step_gpu, "write_json_atomic", lambda path, obj: (seen.append(
        ([r["algorithm"] for r in obj["rows"]], obj["partial"])), real(path, obj)))
    step_gpu.main(["--shape", "tiny", "--device", "cpu", "--reps", "1", "--attn", "sdpa", "--commit", "abc1234",
                   "--out", str(out)])
    assert seen == [(["grpo"], True), (["grpo", "seed"], False), (["grpo", "seed"], False)]
    result = json.loads(out.read_text())
    assert result["commit"] == "abc1234" and result["attn"] == "sdpa"


def test_forward_flops_is_the_hand_count():
    cfg = dict(hidden_size=8, vocab_size=10, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
               intermediate_size=16)
    # per layer: q 8x8 + k,v 2 x 8x4 + o 8x8 + MLP 3 x 8x16 = 64 + 64 + 64 + 384 = 576 weights
    per_token = 2 * 2 * 576 + 2 * 8 * 10
    # 3 new tokens after 2 of context: they attend to 3, 4, 5 keys; QKᵀ and AV = 4 x q_dim FLOPs per key per layer
    attention = 4 * 2 * 8 * (3 + 4 + 5)
    assert step_gpu.forward_flops(cfg, [(2, 3)]) == pytest.approx(3 * per_token + attention)


def test_refuses_cuda_without_a_gpu():
    if step_gpu.torch.cuda.is_available():
        pytest.skip("a GPU is here")
    with pytest.raises(SystemExit):
        step_gpu.parse_args(["--device", "cuda"])


def test_verl_tokens_per_gpu_and_mfu_are_the_hand_arithmetic(tmp_path):
    out = tmp_path / "step_gpu.json"
    step_gpu.main(["--shape", "tiny", "--device", "cpu", "--reps", "1", "--gpus", "2", "--peak-tflops", "0.5",
                   "--out", str(out)])
    result = json.loads(out.read_text())
    # tiny: d=128, V=1500, 4 layers, 4 heads (head_dim 32), 2 KV heads, MLP 384; 2 tasks x 4 trajectories of
    # 48 prompt + 12 response tokens. verl's FlopsCounter by hand:
    #   per layer 128·384·3 + 128·(128 + 64 + 64 + 128) = 147456 + 49152 = 196608; x 4 = 786432; + 2·1500·128
    #   = 1170432 parameters; 6 x 1170432 x 480 tokens = 3370844160; attention 12 x 8·60² x 32 x 4 x 4 = 176947200
    flops = 3370844160 + 176947200
    for row in result["rows"]:
        verl = row["verl"]
        assert verl["tokens"] == 480 and verl["gpus"] == 2
        assert verl["actor_flops"] == flops
        assert verl["step_s"] == pytest.approx(row["step_s"], abs=1e-4)  # the row's own figure is rounded
        assert verl["update_s"] == pytest.approx(row["phases"]["update"]["s"], abs=1e-4)
        assert verl["tokens_per_s_per_gpu"] == pytest.approx(480 / verl["step_s"] / 2, rel=1e-12)
        assert verl["mfu_actor"] == pytest.approx(flops / verl["update_s"] / 2 / 0.5e12, rel=1e-12)
    assert result["peak_bf16_flops"] == 0.5e12
