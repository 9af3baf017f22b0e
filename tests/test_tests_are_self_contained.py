"""Every test file runs alone (`pytest tests/<dir>/test_x.py`): no test module imports another test module. Such
an import only works when the other module happens to be importable and unchanged (test_weight_push.py took its fake
vLLM from test_colocated long after the fakes had moved to tests/rollout/fake_vllm.py). Shared helpers live
in non-test modules (fake_vllm.py, dist_helpers.py, ...). What this static check cannot see (fixtures or state one
file leaves for the next) tests/run_each_file.sh finds by running each file in its own process.

tests/ is a package (an __init__.py in every folder), so a test imports a shared helper by its full name, `from
tests.scoring.scoring_helpers import ...`, with the repository root on sys.path (pytest puts it there, the root being
the first folder above tests/ without an __init__.py); spawned workers inherit that sys.path."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# (importing file, test module it imports): to go. Both run alone (the import is by full name), but they share
# test_fsdp_update's CASES, _full and _update, which move to dist_helpers.py once the edit in flight there lands.
EXCEPTIONS = {("distributed/test_fsdp_one_device.py", "tests.distributed.test_fsdp_update"),
              ("distributed/test_tp_train.py", "tests.distributed.test_fsdp_update")}


def imported_test_modules(path: Path, test_modules: set[str]) -> list[str]:
    """The test modules `path` imports, top-level and inside functions alike, by full name (`tests.x.test_y`, `from
    tests.x import test_y`) or by a bare name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [n for n in names if n.split(".")[-1] in test_modules]
    return found


def test_no_test_module_imports_another(tmp_path):
    files = sorted(TESTS.rglob("*.py"))
    test_modules = {p.stem for p in files if p.stem.startswith("test_")}
    found = {(str(p.relative_to(TESTS)), name) for p in files for name in imported_test_modules(p, test_modules)}
    bad = sorted(found - EXCEPTIONS)
    assert not bad, "\n".join(f"{path} imports {name}" for path, name in bad)
    assert EXCEPTIONS <= found, f"no longer imported, drop from EXCEPTIONS: {sorted(EXCEPTIONS - found)}"
    # the check sees the import that broke test_weight_push (inside a function, after a sys.path insert)
    (tmp_path / "test_a.py").write_text("def worker():\n    from test_colocated import FakeLLM\n")
    assert imported_test_modules(tmp_path / "test_a.py", test_modules) == ["test_colocated"]
    (tmp_path / "test_b.py").write_text("from tests.rollout.test_colocated import FakeLLM\n"
                                        "from tests.rollout import fake_vllm, test_colocated\n")
    assert imported_test_modules(tmp_path / "test_b.py", test_modules) == [
        "tests.rollout.test_colocated", "tests.rollout.test_colocated"]

