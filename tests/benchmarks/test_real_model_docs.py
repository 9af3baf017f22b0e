"""benchmarks/real_model.py: the loop detector by hand, and docs/demo.md, 'SmolLM2 in a sparse pool', is the section
results/real_model_sparse_*.json generate (rerun a run, or edit a digit, and this fails until
`python benchmarks/real_model.py --markdown` is pasted)."""

from pathlib import Path

from tests._bench import import_benchmark

ROOT = Path(__file__).resolve().parents[2]
real_model = import_benchmark("real_model")


def test_an_episode_oscillates_when_two_moves_repeat_as_abab():
    assert real_model.oscillates(["go east", "go south", "go north", "go south", "go north"])
    assert not real_model.oscillates(["go east", "go south", "go east", "take fondue"])  # A, B, A then another
    assert not real_model.oscillates(["go north", "go north", "go north", "go north"])  # one move repeated
    assert not real_model.oscillates(["go south", "take key"])  # too short to repeat
    assert real_model.oscillates(["go south", "go north", "go south", "go north"])


def test_the_sparse_section_is_generated_from_the_committed_jsons():
    results = real_model.sparse_results()
    assert set(results) == set(real_model.SPARSE_RUNS)
    section = real_model.sparse_docs_section(results)
    assert section.startswith(real_model.SPARSE_HEADING)
    assert "**Oracle analyzer, lr 1e-5, seed 1.**" in section and "**Self analyzer, lr 1e-6, seed 1.**" in section
    assert section in (ROOT / "docs" / "demo.md").read_text()
