"""Every test file runs alone (`pytest tests/<dir>/test_x.py`): no test module imports another test module. Such
an import only works when the other module happens to be importable and unchanged (test_weight_push.py took its fake
vLLM from test_colocated long after the fakes had moved to tests/rollout/fake_vllm.py). Shared helpers live
in non-test modules (fake_vllm.py, dist_helpers.py, ...). What this static check cannot see (fixtures or state one
file leaves for the next) tests/run_each_file.sh finds by running each file in its own process.

tests/ is a package (an __init__.py in every folder), so a test imports a shared helper by its full name, `from
tests.scoring.scoring_helpers import ...`, with the repository root on sys.path (pytest puts it there, the root being
the first folder above tests/ without an __init__.py); spawned workers inherit that sys.path. No file here, nor in
benchmarks/ and experiments/ (packages too, run as `python -m benchmarks.NAME`), edits sys.path. Only the tests of
those scripts import them: tests/benchmarks/, tests/experiments/, and tests/vllm_real/ (which runs two experiments
against the real vLLM); a library test never depends on a benchmark."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# (importing file, test module it imports): to go. Both run alone (the import is by full name), but they share
# test_fsdp_update's CASES, _full and _update, which move to dist_helpers.py once the edit in flight there lands.
EXCEPTIONS = {("distributed/test_fsdp_one_device.py", "tests.distributed.test_fsdp_update"),
              ("distributed/test_tp_train.py", "tests.distributed.test_fsdp_update")}
ROOT = TESTS.parent
SCRIPT_PACKAGES = ("benchmarks", "experiments")
# the test folders that may import the scripts of SCRIPT_PACKAGES: the scripts' own tests
SCRIPT_TESTS = ("benchmarks", "experiments", "vllm_real")


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


LIST_EDITS = {"insert", "append", "extend", "remove", "pop", "clear", "reverse", "sort", "__setitem__", "__iadd__"}


def sys_path_edits(path: Path) -> list[int]:
    """The lines of `path` that change sys.path, at any depth: `sys.path.insert(...)` and the other list methods that
    edit it, `sys.path = ...`, `sys.path[...] = ...`, `sys.path += ...`."""
    def is_sys_path(node) -> bool:
        node = node.value if isinstance(node, ast.Subscript) else node
        return (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                and node.value.id == "sys")

    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LIST_EDITS
                and is_sys_path(node.func.value)):
            lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            lines += [node.lineno for t in targets if is_sys_path(t)]
    return sorted(lines)


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


def test_every_folder_is_a_package():
    # a folder without __init__.py would make its files top-level modules named by their basename, imported with
    # that folder on sys.path: `tests.` imports would then hold only when the root happens to be there too
    folders = {p.parent for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts}
    missing = sorted(str(f.relative_to(TESTS.parent)) for f in folders if not (f / "__init__.py").is_file())
    assert not missing, f"add an __init__.py (a one-line docstring) to: {missing}"


def test_no_file_edits_sys_path(tmp_path):
    files = [p for folder in ("tests", *SCRIPT_PACKAGES) for p in sorted((ROOT / folder).rglob("*.py"))]
    bad = [f"{p.relative_to(ROOT)}:{line}" for p in files for line in sys_path_edits(p)]
    assert not bad, ("these lines change sys.path; import a helper of another folder by its full name instead "
                     "(`from tests.scoring.scoring_helpers import ...`, `from benchmarks.common import ...`):\n"
                     + "\n".join(bad))
    # the check sees the insert this suite once had in 23 files, and the other ways to edit sys.path
    (tmp_path / "test_a.py").write_text(
        "import sys\nfrom pathlib import Path\n\n"
        "sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'scoring'))\n"
        "def f():\n    sys.path.append('x')\n    sys.path[:0] = ['y']\n    sys.path += ['z']\n"
        "print(sys.path.index('x'))\n")
    assert sys_path_edits(tmp_path / "test_a.py") == [4, 6, 7, 8]  # reading it (line 9) is fine


def imports_of(path: Path, packages: tuple[str, ...]) -> list[str]:
    """The modules of `packages` that `path` imports (`from benchmarks import step`, `import experiments.x`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
        found += [n for n in names if n.split(".")[0] in packages]
    return found


def test_only_the_scripts_tests_import_benchmarks_and_experiments(tmp_path):
    bad = [f"{p.relative_to(ROOT)} imports {name}" for p in sorted(TESTS.rglob("*.py"))
           if p.relative_to(TESTS).parts[0] not in SCRIPT_TESTS for name in imports_of(p, SCRIPT_PACKAGES)]
    assert not bad, ("a library test depends on a benchmark or experiment script; move what both need into seedfast/ "
                     "or a test helper, or the test beside the script's tests:\n" + "\n".join(bad))
    (tmp_path / "test_a.py").write_text("import json\nfrom benchmarks.common import PeakRSS\n"
                                        "def f():\n    import experiments.demo_seeds\n")
    assert imports_of(tmp_path / "test_a.py", SCRIPT_PACKAGES) == ["benchmarks.common", "experiments.demo_seeds"]
