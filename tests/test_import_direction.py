"""Imports between seedfast's packages go one way (docs/architecture.md, 'Import direction'), and the modules inside
one package import each other without a cycle.

Every module under seedfast/ is parsed with `ast`; imports at any
depth count (module level, inside functions, under `if TYPE_CHECKING`), relative imports are resolved, and so are
modules imported by name at run time (`importlib.import_module("seedfast...")` and the `Command("seedfast...")`
table of cli.py). An edge outside ALLOWED fails, naming the file, the line and the import; so does a cycle of
imports between the modules of one package, naming each import of the cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# What each package (or top-level module) of seedfast may import from the others. "seedfast" is the package's
# own __init__ (the version string): anyone may import it, and it imports nothing.
ALLOWED: dict[str, set[str]] = {
    "seedfast": set(),
    "config": set(),
    "algo": set(),      # the math in plain torch
    "kernels": set(),   # Triton kernels only
    "model": set(),     # returns hidden states; never forms logits, so it needs no ops
    "envs": set(),
    "context": set(),   # the teacher context (segments, skills, truncation, StepSample): config-free, a leaf
    "ops": {"algo", "kernels"},  # the torch backend reuses algo's per-token formulas (each written once)
    "skills": {"envs"},
    "scoring": {"context", "model", "ops"},
    "rollout": {"context", "envs", "model", "skills"},  # builds StepSamples and prompt segments (context)
    # scale-out (FSDP2, tensor parallel, the memory plan): reads the `dist:` section, wraps the model, shards the head
    "distributed": {"config", "model", "ops"},
    # what SFT and RL share: builders, optimizer, checkpoints (sharded ones with distributed's DCP)
    "runtime": {"config", "distributed", "envs", "model", "rollout"},
    "sft": {"config", "context", "envs", "model", "ops", "rollout", "runtime", "skills"},
    "train": {"algo", "config", "context", "distributed", "envs", "model", "ops", "rollout", "runtime", "scoring",
              "skills"},
    "app": set(),  # the commands: every package below them (set just after this table)
    "cli": {"config", "app"},  # command modules are imported by name when they run
    "__main__": {"cli"},
}
# seedfast/seeds.py, every seed derivation (one module, so no package derives its own): like the root package it
# imports nothing, and every package may import it (rollout and envs too, which sit below runtime)
ALLOWED["seeds"] = set()
# seedfast/sampling_params.py, what one generation call samples with: the engines (rollout) and the policy's text
# writers (skills, below rollout) both build it, so it is a leaf every package may import, like seeds.py
ALLOWED["sampling_params"] = set()
for _name in set(ALLOWED) - {"seedfast", "seeds", "sampling_params"}:
    ALLOWED[_name] |= {"seeds", "sampling_params"}
# app builds with runtime/setup.py and calls the libraries: it may import every package but cli and __main__,
# and nothing but cli imports it (test_nothing_but_cli_imports_app)
ALLOWED["app"] = set(ALLOWED) - {"app", "cli", "__main__"}

# Imports that break the layering on purpose, as {(file relative to the repo, imported module): reason}. None
# today: the `envs make` command, which read config below train, moved to seedfast/app/envs.py.
EXCEPTIONS: dict[tuple[str, str], str] = {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _node(module: str) -> str | None:
    """The package (first component below seedfast) a dotted module belongs to; None outside seedfast."""
    parts = module.split(".")
    if parts[0] != "seedfast":
        return None
    return parts[1] if len(parts) > 1 else "seedfast"


def _source_files() -> list[Path]:
    files = sorted((ROOT / "seedfast").rglob("*.py"))
    return [f for f in files if "__pycache__" not in f.parts]


_MODULES = {_module_name(p) for p in _source_files()}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported dotted module) for every import in the file, at any depth. `from package import name` imports
    package.name when that is a module of seedfast, else package."""
    module = _module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from seedfast import cli` / `from . import attention_sdpa`: a name may be a module
            found = [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in _MODULES]
            if len(found) < len(node.names):
                found.append(target)
            out += [(node.lineno, name) for name in found]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if (name in ("import_module", "Command") and isinstance(first, ast.Constant)
                    and isinstance(first.value, str) and first.value.startswith("seedfast.")):
                out.append((node.lineno, first.value))
    return out


def _known(name: str) -> bool:
    return name in ALLOWED


def _edges() -> list[tuple[str, int, str, str, str]]:
    """(file, line, imported module, source package, target package) for every cross-package import."""
    edges = []
    for path in _source_files():
        src = _node(_module_name(path))
        for line, target in _imports(path):
            dst = _node(target)
            if dst is None or dst == src:
                continue
            if not _known(dst):  # `from seedfast import __version__`: a name of the root package
                dst = "seedfast"
            edges.append((str(path.relative_to(ROOT)), line, target, src, dst))
    return edges


def test_every_package_has_a_place_in_the_layering():
    found = {_node(_module_name(p)) for p in _source_files()}
    missing = sorted(n for n in found if not _known(n))
    assert not missing, f"packages with no entry in ALLOWED (add them to the layering and the docs): {missing}"


def test_allowed_graph_is_acyclic():
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        if state.get(n) == 1:
            pytest.fail(f"ALLOWED has a cycle: {' -> '.join(path + [n])}")
        if state.get(n) == 2:
            return
        state[n] = 1
        for m in sorted(ALLOWED.get(n, ())):
            visit(m, path + [n])
        state[n] = 2

    for n in sorted(ALLOWED):
        visit(n, [])


def test_the_parser_sees_known_edges():
    # guards the checker itself: a parser that found nothing would pass every other test
    pairs = {(src, dst) for _, _, _, src, dst in _edges()}
    for edge in [("ops", "algo"), ("ops", "kernels"), ("scoring", "ops"), ("train", "rollout"),
                 ("rollout", "context"), ("scoring", "context"), ("train", "distributed"), ("distributed", "model"),
                 ("app", "train"), ("cli", "app"), ("__main__", "cli"), ("train", "seeds"), ("rollout", "seeds")]:
        assert edge in pairs, f"expected the import {edge[0]} -> {edge[1]} to be found"


def test_imports_follow_the_layering():
    bad = []
    for file, line, target, src, dst in _edges():
        if dst == "seedfast" or dst in ALLOWED[src] or (file, target) in EXCEPTIONS:
            continue
        bad.append(f"{file}:{line}: {src} imports {target} ({dst}); {src} may import {sorted(ALLOWED[src])}")
    assert not bad, "imports against the layering of docs/architecture.md:\n" + "\n".join(bad)


def test_nothing_but_cli_imports_app():
    users = sorted({src for _, _, _, src, dst in _edges() if dst == "app"} - {"cli"})
    assert not users, f"only cli may import seedfast.app (the commands); found {users}"


def test_root_package_imports_nothing_from_seedfast():
    assert not [t for _, t in _imports(ROOT / "seedfast" / "__init__.py") if _node(t)]


def test_exceptions_are_still_needed():
    present = {(file, target) for file, _, target, _, _ in _edges()}
    stale = sorted(key for key in set(EXCEPTIONS) - present if (ROOT / key[0]).exists())
    assert not stale, f"EXCEPTIONS entries no import needs any more (remove them): {stale}"


def _package_graph() -> dict[str, dict[str, tuple[str, int]]]:
    """module -> {module of the same package it imports: (file, line) of the first such import}. Packages import each
    other only down the layering, which the tests above hold acyclic, so a cycle can only lie inside one package."""
    graph: dict[str, dict[str, tuple[str, int]]] = {}
    for path in _source_files():
        src = _module_name(path)
        edges = graph.setdefault(src, {})
        for line, target in _imports(path):
            if target in _MODULES and target != src and _node(target) == _node(src):
                edges.setdefault(target, (str(path.relative_to(ROOT)), line))
    return graph


def _cycles(graph: dict[str, dict[str, tuple[str, int]]]) -> list[list[str]]:
    """The shortest cycle through each module that lies on one, each listed once, starting at its smallest module."""
    found: set[tuple[str, ...]] = set()
    for start in sorted(graph):
        parent: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in parent:
            following = []
            for n in frontier:
                for m in sorted(graph.get(n, {})):
                    if m not in parent:
                        parent[m] = n
                        following.append(m)
            frontier = following
        if start in parent:
            cycle = [parent[start]]
            while cycle[-1] != start:
                cycle.append(parent[cycle[-1]])
            cycle.reverse()  # start, ..., the module that imports start
            i = cycle.index(min(cycle))
            found.add(tuple(cycle[i:] + cycle[:i]))
    return [list(c) for c in sorted(found)]


def _describe(cycle: list[str], graph: dict[str, dict[str, tuple[str, int]]]) -> str:
    hops = [f"{a} imports {b} ({':'.join(map(str, graph[a][b]))})" for a, b in zip(cycle, cycle[1:] + cycle[:1])]
    return "; ".join(hops)


def test_the_cycle_finder_names_each_cycle_once():
    # guards the checker: a finder that found nothing would pass the test below
    edge = ("f.py", 1)
    graph = {"a": {"b": edge}, "b": {"c": edge, "a": edge}, "c": {"a": edge}, "d": {"a": edge}, "e": {}}
    assert _cycles(graph) == [["a", "b"], ["a", "b", "c"]]
    assert _cycles({"a": {"b": edge}, "b": {}}) == []


def test_the_package_graph_sees_imports_at_every_depth():
    graph = _package_graph()
    for src, dst in [("seedfast.model.attention", "seedfast.model.attention_sdpa"),  # `from . import x`
                     ("seedfast.model.attention_sdpa", "seedfast.model.varlen"),  # under `if TYPE_CHECKING`
                     ("seedfast.train.async_rollout", "seedfast.train.draws"),  # inside a function
                     ("seedfast.config", "seedfast.config.loading"),  # a package's __init__
                     ("seedfast.config.schema", "seedfast.config.yaml_io")]:
        assert dst in graph[src], f"expected the import {src} -> {dst} to be found"


def test_no_import_cycle_inside_a_package():
    graph = _package_graph()
    cycles = [_describe(c, graph) for c in _cycles(graph)]
    assert not cycles, ("import cycles between the modules of one package (move what both need into a module of its "
                        "own that neither imports back):\n" + "\n".join(cycles))
