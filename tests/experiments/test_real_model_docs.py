"""experiments/real_model.py: the loop detector by hand, and the section 'SmolLM2 in a sparse pool' reads every run
(docs/demo.md holds what it generates from the committed JSON: tests/test_docs_generated.py)."""

import json
from pathlib import Path

from experiments import real_model

ROOT = Path(__file__).resolve().parents[2]


def test_an_episode_oscillates_when_two_moves_repeat_as_abab():
    assert real_model.oscillates(["go east", "go south", "go north", "go south", "go north"])
    assert not real_model.oscillates(["go east", "go south", "go east", "take fondue"])  # A, B, A then another
    assert not real_model.oscillates(["go north", "go north", "go north", "go north"])  # one move repeated
    assert not real_model.oscillates(["go south", "take key"])  # too short to repeat
    assert real_model.oscillates(["go south", "go north", "go south", "go north"])


def test_the_sparse_section_reads_every_run():
    results = real_model.sparse_results()
    assert set(results) == set(real_model.SPARSE_RUNS)
    section = real_model.sparse_docs_section(results)
    assert section.startswith(real_model.SPARSE_HEADING)
    assert "**Oracle analyzer, lr 1e-5, seed 1.**" in section and "**Self analyzer, lr 1e-6, seed 1.**" in section


def test_a_run_that_trained_seed_alone_is_collected(tmp_path):
    """The study's other forms run `demo.algorithms=[seed]`: no GRPO folder, and the collection reads what there is."""
    (tmp_path / "seed").mkdir()
    rows = [{"time/step": 60.0, "train/success_rate": 0.5}, {"time/step": 64.0, "train/success_rate": 0.25}]
    (tmp_path / "seed" / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert real_model.seconds_per_update(tmp_path) == {"seed": 62.0}
    assert list(real_model.lane_curves(tmp_path)) == ["seed"]
