"""Every test file that skips without CUDA is listed in docs/kernels.md, 'The tests that run only on a GPU', with
what it checks: a CPU-only `make test` skips those cases, so the list is where a GPU window's reader finds them.
Listed files must exist (no stale rows)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "kernels.md"
SECTION = "### The tests that run only on a GPU"

# How a test here skips without CUDA: the gpu marker ("needs a CUDA GPU (skipped elsewhere)", pyproject.toml),
# directly or through tests/kernels/triton_reference.py's GPU marks; a skipif on torch.cuda.is_available(); or
# pytest.skip called when it is false.
SKIPS_WITHOUT_CUDA = re.compile(
    r"mark\.gpu\b"
    r"|pytestmark\s*=\s*GPU\b"
    r"|marks\s*=\s*GPU\b"
    r"|skipif\(\s*not\s+torch\.cuda\.is_available\(\)"
    r"|if\s+not\s+(?:\w+\.)*torch\.cuda\.is_available\(\)\s*:\s*\n\s*pytest\.skip\(")


def gpu_only_files() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "tests").rglob("test_*.py"))
            if p.resolve() != Path(__file__).resolve() and SKIPS_WITHOUT_CUDA.search(p.read_text(encoding="utf-8"))}


def listed_files() -> set[str]:
    text = DOC.read_text(encoding="utf-8")
    assert SECTION in text, f"docs/kernels.md has no section {SECTION!r}"
    body = text.split(SECTION, 1)[1]
    body = re.split(r"^#{1,3} ", body, maxsplit=1, flags=re.M)[0]  # up to the next heading
    return set(re.findall(r"^\|\s*`(tests/[\w/]+\.py)`\s*\|", body, re.M))


def test_the_detector_sees_the_known_gpu_files():
    found = gpu_only_files()
    for known in ("tests/kernels/test_triton_gpu.py", "tests/scoring/test_scoring_gpu.py",
                  "tests/model/test_varlen_attention.py", "tests/rollout/test_vllm_engine.py"):
        assert known in found, known


def test_every_test_file_that_skips_without_cuda_is_listed():
    missing = sorted(gpu_only_files() - listed_files())
    assert not missing, (f"these test files skip without CUDA and are missing from docs/kernels.md, {SECTION[4:]!r} "
                         f"(add a row saying what they check): {missing}")


def test_listed_files_exist_and_skip_without_cuda():
    listed = listed_files()
    stale = sorted(f for f in listed if not (ROOT / f).exists() or f not in gpu_only_files())
    assert listed and not stale, f"rows of docs/kernels.md, {SECTION[4:]!r} that are not GPU-only test files: {stale}"
