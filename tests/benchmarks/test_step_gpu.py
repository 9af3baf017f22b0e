"""benchmarks/step_gpu.py runs end to end on CPU at the tiny shape (so a GPU window is not lost to a crash), counts
the tokens of each phase from the batch, and its FLOP count is the hand arithmetic."""

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import step_gpu  # noqa: E402


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
