"""experiments/demo_seeds.py's read-out by hand (docs/demo.md's results section is what it generates from the
committed JSON: tests/test_docs_generated.py)."""

import math
from pathlib import Path

import pytest

from experiments import demo_seeds

ROOT = Path(__file__).resolve().parents[2]


def _run(before: float, after: dict[str, float], last_half: dict[str, float]) -> dict:
    return {"before": {"eval/success_rate": before},
            "after": {a: {"eval/success_rate": v} for a, v in after.items()},
            "means": {c: {"first_quarter": 0.5, "last_half": v} for c, v in last_half.items()}}


def test_a_held_out_change_has_the_sampling_error_of_two_independent_shares():
    # p = 0.5 over 64 games x 4 plays: sqrt(2 * 0.25 / 256) = sqrt(1/512)
    assert demo_seeds.change_standard_error(0.5, 64, 4) == pytest.approx(1 / math.sqrt(512))
    assert demo_seeds.change_standard_error(1.0, 64, 4) == 0.0


def test_the_readout_is_each_algorithm_against_the_control_and_seed_against_grpo():
    result = {"runs": {
        "0": _run(0.50, {"grpo": 0.60, "seed": 0.55}, {"control": 0.70, "grpo": 0.80, "seed": 0.75}),
        "1": _run(0.40, {"grpo": 0.30, "seed": 0.45}, {"control": 0.60, "grpo": 0.50, "seed": 0.65}),
    }}
    said = demo_seeds.readout(result)
    assert said["lead"]["grpo"] == pytest.approx([0.10, -0.10])
    assert said["lead"]["seed"] == pytest.approx([0.05, 0.05])
    assert said["heldout_change"]["grpo"] == pytest.approx([0.10, -0.10])
    assert said["heldout_change"]["seed"] == pytest.approx([0.05, 0.05])
    assert said["seed_minus_grpo"]["pool_last_half"] == pytest.approx([-0.05, 0.15])
    assert said["seed_minus_grpo"]["heldout"] == pytest.approx([-0.05, 0.15])

