"""The project explains itself: code, tests, benchmarks, configs and docs cite only documents of this repository.

Citations of documents that live outside it (the method spec, the design notes, the pitfall list, the demo
calibration, anything under a `shared/` folder) fail; a pointer into docs/ must name a file that exists, and a
section it quotes ("docs/algorithms.md, 'OPD gate'") must be a heading of that file.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ["seedfast", "tests", "benchmarks", "experiments", "configs", "docs", "README.md"]
THIS_FILE = Path(__file__).resolve()  # it has to spell the patterns out

# Each pattern names a document outside the repository, or a path into one.
OUTSIDE = [
    re.compile(r"\bSPEC\s*§"),
    re.compile(r"\bDESIGN\s*§"),
    re.compile(r"\bPITFALLS\b"),
    re.compile(r"\b(?:SPEC|DESIGN|CALIBRATION)\.md\b"),
    re.compile(r"\bSPEC\b"),  # "the SPEC loss", "SPEC defaults"
    re.compile(r"\.\./shared\b"),
    re.compile(r"(?<![\w.-])shared/"),
]

# Files whose owners are changing them right now: owned by another change in progress. Each still holds
# citations (test_allow_list_is_not_stale checks that); remove an entry once its file is clean.
ALLOW: set[str] = set()


def _files() -> list[Path]:
    out = []
    for name in SCANNED:
        path = ROOT / name
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        out += [p for p in candidates if "__pycache__" not in p.parts and p.resolve() != THIS_FILE]
    return out


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:  # images and other binary results
        return None


def _citations(text: str) -> list[tuple[int, str]]:
    hits = []
    for number, line in enumerate(text.splitlines(), 1):
        if any(p.search(line) for p in OUTSIDE):
            hits.append((number, line.strip()))
    return hits


def test_no_citation_of_documents_outside_the_repository():
    bad = []
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        text = _text(path)
        if rel in ALLOW or text is None:
            continue
        bad += [f"{rel}:{n}: {line[:120]}" for n, line in _citations(text)]
    assert not bad, ("cite docs/ (algorithms, architecture, performance, reference, pitfalls, demo) instead of "
                     "documents outside the repository:\n" + "\n".join(bad))


def test_allow_list_is_not_stale():
    clean = sorted(rel for rel in ALLOW if not (ROOT / rel).exists() or not _citations(_text(ROOT / rel) or ""))
    assert not clean, f"these files cite nothing outside the repository any more: remove them from ALLOW: {clean}"


def _headings(doc: Path) -> set[str]:
    return {m.group(1).strip() for m in re.finditer(r"^#{1,6}\s+(.+)$", doc.read_text(encoding="utf-8"), re.M)}


# "docs/x.md, 'Section'", "docs/x.md ('A', 'B')", "docs/x.md: 'A', 'B' and 'C'"; comment markers and line breaks
# inside a pointer are joined first.
POINTER = re.compile(r"docs/([\w-]+\.md)(?:[,:]?\s*\(?\s*((?:'[^'\n]{1,80}'(?:,\s*|\s+and\s+)?)+))?")


def test_pointers_into_docs_name_existing_files_and_sections():
    bad = []
    for path in _files():
        text = _text(path)
        if text is None:
            continue
        rel = path.relative_to(ROOT).as_posix()
        joined = re.sub(r"[ \t]*\n[ \t]*(?:#[ \t]*)?", " ", text)
        for m in POINTER.finditer(joined):
            doc = ROOT / "docs" / m.group(1)
            if not doc.exists():
                bad.append(f"{rel}: docs/{m.group(1)} does not exist")
                continue
            for section in re.findall(r"'([^']+)'", m.group(2) or ""):
                if section not in _headings(doc):
                    bad.append(f"{rel}: docs/{m.group(1)} has no section {section!r}")
    assert not bad, "\n".join(bad)
