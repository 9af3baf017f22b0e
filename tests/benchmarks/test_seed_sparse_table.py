"""benchmarks/seed_sparse.py: the summary by hand, and the section of docs/demo.md, 'SEED in the sparse regime', is
the one the committed JSONs generate, table and prose (rerun an arm, or edit a digit, and this fails until
`python benchmarks/seed_sparse.py report --markdown` regenerates it)."""

import json
from pathlib import Path

import pytest

from tests._bench import import_benchmark

ROOT = Path(__file__).resolve().parents[2]
seed_sparse = import_benchmark("seed_sparse")


def test_summary_reads_the_windows_the_docs_name():
    curve = [0.1 * i for i in range(16)]
    record = {"per_update": {"train/success_rate": curve, "teacher/contrast": [0.1, None, 0.3]}}
    s = seed_sparse.summary(record)
    assert s["pool 1-8"] == pytest.approx(sum(curve[:8]) / 8)  # updates 1-8
    assert s["pool 4-16"] == pytest.approx(sum(curve[3:]) / 13)  # updates 4-16
    assert s["pool last half"] == pytest.approx(sum(curve[8:]) / 8)
    assert s["teacher/contrast"] == pytest.approx(0.2)  # updates without a teacher-valid token are left out


def test_the_docs_section_is_generated_from_the_committed_json():
    data = json.loads(seed_sparse.RESULT.read_text())
    assert seed_sparse.docs_section(data) in (ROOT / "docs" / "demo.md").read_text()


def test_seeds_are_named_as_a_person_writes_them():
    assert [seed_sparse._seeds_text(s) for s in ([], [7], [5, 6], [5, 6, 7])] == [
        "no seed", "seed 7", "seeds 5 and 6", "seeds 5, 6 and 7"]
