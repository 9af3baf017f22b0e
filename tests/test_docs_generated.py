"""The docs' generated sections (docs/generate.py, `make docs`) are what their generators make today from the committed
JSON and the code: rerun a benchmark or an experiment, change an option, or edit a digit in a generated table, and this
fails until `make docs` is run."""

import pytest

from docs import generate


def test_every_generated_section_is_current():
    stale = generate.stale()
    assert not stale, "stale generated sections (run `make docs`):\n" + "\n".join(stale)


@pytest.fixture
def doc_copy(tmp_path):
    """docs/demo.md copied under tmp_path/docs, and the demo's sections pointed at it."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "demo.md").write_text((generate.ROOT / "docs" / "demo.md").read_text())
    return tmp_path, tuple(s for s in generate.SECTIONS if s.doc == "docs/demo.md")


def test_an_edited_digit_is_found_and_rewritten(doc_copy):
    root, sections = doc_copy
    path = root / "docs" / "demo.md"
    text = path.read_text()
    first = sections[0]
    inside = text.index(first.begin) + len(first.begin)
    digit = next(i for i in range(inside, text.index(first.end)) if text[i].isdigit())
    path.write_text(text[:digit] + str((int(text[digit]) + 1) % 10) + text[digit + 1:])
    assert generate.stale(sections, root) == [f"docs/demo.md: {first.name}"]
    assert generate.stale(sections, root, write=True) == [f"docs/demo.md: {first.name}"]
    assert path.read_text() == text and generate.stale(sections, root) == []


def test_a_lost_marker_is_one_error_naming_the_doc_and_section(doc_copy):
    root, sections = doc_copy
    path = root / "docs" / "demo.md"
    path.write_text(path.read_text().replace(sections[1].end, ""))
    with pytest.raises(ValueError, match=f"docs/demo.md: .*{sections[1].name!r}"):
        generate.stale(sections, root)
