"""experiments/real_model.py: the loop detector by hand, and the section 'SmolLM2 in a sparse pool' reads every run
(docs/demo.md holds what it generates from the committed JSON: tests/test_docs_generated.py)."""

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
