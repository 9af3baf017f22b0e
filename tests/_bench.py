"""The one place the tests know where the benchmark scripts live: `step = import_benchmark("step")` imports
benchmarks/step.py for a test. The scripts are not a package (each runs as `python benchmarks/x.py` and imports its
siblings by name: `from _common import ...`), so benchmarks/ goes on sys.path, once, and a script is imported by its
name, one module object per script however many test files import it. tests/test_tests_are_self_contained.py lets
no other file of tests/ change sys.path."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def import_benchmark(name: str) -> ModuleType:
    """benchmarks/<name>.py as the module `name` (e.g. "step", "_common")."""
    if not (BENCHMARKS / f"{name}.py").is_file():
        raise ModuleNotFoundError(f"no benchmark script {BENCHMARKS / name}.py", name=name)
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module(name)
