"""experiments/seed_sparse.py: the summary by hand (docs/demo.md, 'SEED in the sparse regime', is what it generates
from the committed JSON: tests/test_docs_generated.py)."""

from pathlib import Path

import pytest

from experiments import seed_sparse

ROOT = Path(__file__).resolve().parents[2]


def test_summary_reads_the_windows_the_docs_name():
    curve = [0.1 * i for i in range(16)]
    record = {"per_update": {"train/success_rate": curve, "teacher/contrast": [0.1, None, 0.3]}}
    s = seed_sparse.summary(record)
    assert s["pool 1-8"] == pytest.approx(sum(curve[:8]) / 8)  # updates 1-8
    assert s["pool 4-16"] == pytest.approx(sum(curve[3:]) / 13)  # updates 4-16
    assert s["pool last half"] == pytest.approx(sum(curve[8:]) / 8)
    assert s["teacher/contrast"] == pytest.approx(0.2)  # updates without a teacher-valid token are left out


def test_seeds_are_named_as_a_person_writes_them():
    assert [seed_sparse._seeds_text(s) for s in ([], [7], [5, 6], [5, 6, 7])] == [
        "no seed", "seed 7", "seeds 5 and 6", "seeds 5, 6 and 7"]
