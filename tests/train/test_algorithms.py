"""One place per algorithm (#22 item 5): train/algorithms.py's spec table, config/loading.py's check table, and
nothing else that tests the algorithm's name."""

import ast
import dataclasses
from pathlib import Path

import pytest

from seedfast.config import load_config
from seedfast.config.loading import ALGORITHM_CHECKS
from seedfast.train import algorithms, privileged
from seedfast.train.algorithms import ALGORITHMS, AlgorithmSpec, check_tables, schema_algorithms
from seedfast.train.step_plan import plan_step

PACKAGE = Path(__file__).resolve().parents[2] / "seedfast"


def test_both_tables_name_the_schemas_algorithms():
    assert set(schema_algorithms()) == {"grpo", "seed", "sdar", "grsd"}
    assert set(ALGORITHMS) == set(ALGORITHM_CHECKS) == set(schema_algorithms())
    assert all(spec.name == name for name, spec in ALGORITHMS.items())


def test_an_algorithm_without_its_spec_or_its_check_fails():
    allowed = ("grpo", "seed", "fifth")
    with pytest.raises(RuntimeError, match="train/algorithms.py ALGORITHMS names"):
        check_tables(allowed, ["grpo", "seed"], allowed)
    with pytest.raises(RuntimeError, match="config/loading.py ALGORITHM_CHECKS names"):
        check_tables(allowed, allowed, ["grpo", "seed"])
    check_tables(allowed, allowed, allowed)


# name: (writer, teacher, judge, analyzer, modulate, reflection_update), written out by hand
SPECS = {
    "grpo": (None, "none", None, None, None, False),
    "seed": (privileged.seed_skills, "opd", None, privileged.run_analyzer, None, False),
    "sdar": (privileged.sdar_skills, "opd", None, privileged.sdar_analyzer, None, False),
    "grsd": (privileged.grsd_guidance, "scorer", privileged.make_judge, None, algorithms.grsd_modulate, True),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_what_each_algorithm_does(name):
    spec = ALGORITHMS[name]
    assert (spec.privileged, spec.teacher, spec.judge, spec.analyzer, spec.modulate,
            spec.reflection_update) == SPECS[name]
    assert spec.opd == (name in ("seed", "sdar"))


def test_a_spec_that_cannot_work_is_refused():
    with pytest.raises(ValueError, match="needs privileged text"):
        AlgorithmSpec("fifth", teacher="opd")
    with pytest.raises(ValueError, match="teacher='scorer'"):
        AlgorithmSpec("fifth", privileged=privileged.seed_skills, teacher="opd", modulate=algorithms.grsd_modulate)


def test_the_plan_and_the_privileged_text_read_the_spec(monkeypatch):
    calls = []

    def writer(ctx, trajectories):
        calls.append((len(trajectories), list(ctx.group_of), ctx.judge, ctx.analyzer))
        return privileged.Privileged(["skill"] * len(trajectories))

    monkeypatch.setitem(ALGORITHMS, "grpo", AlgorithmSpec("grpo", privileged=writer, teacher="scorer",
                                                         reflection_update=True))
    cfg = load_config(None, ["algorithm=grpo"])
    plan = plan_step(cfg)
    assert (plan.privileged_text, plan.teacher, plan.score_pass, plan.opd, plan.reflection_update) == (
        True, "scorer", True, False, True)
    ctx = privileged.WriterContext(cfg, engine=None, tokenizer=None, group_of=[0, 0], judge="j", analyzer="a")
    out = algorithms.privileged_text(ctx, [object(), object()])
    assert out.episode == ["skill", "skill"] and calls == [(2, [0, 0], "j", "a")]


def test_an_algorithm_without_a_writer_has_no_privileged_text():
    cfg = load_config(None, ["algorithm=grpo"])
    ctx = privileged.WriterContext(cfg, engine=None, tokenizer=None, group_of=[0, 0, 0])
    out = algorithms.privileged_text(ctx, [object()] * 3)
    assert out.episode == [None] * 3 and out.step == [{}] * 3


def test_spec_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ALGORITHMS["seed"].teacher = "none"


def _name_tests(path: Path) -> list[str]:
    """Comparisons (==, !=, in, ...) of `<...>.algorithm` or of a local `algorithm` / `algo` in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any((isinstance(s, ast.Attribute) and s.attr == "algorithm")
                   or (isinstance(s, ast.Name) and s.id in ("algorithm", "algo")) for s in sides):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return found


def test_nothing_else_tests_the_algorithms_name():
    found = [hit for p in sorted(PACKAGE.rglob("*.py")) for hit in _name_tests(p)]
    assert not found, f"tests of the algorithm's name outside the two tables (use its spec or its check): {found}"


def test_the_trainer_builds_its_analyzer_once_per_run(overrides, tiny_policy, train_games, tmp_path, monkeypatch):
    from seedfast.train.rl import Trainer

    built = []
    real = privileged.skill_analyzer

    def counted(cfg, kind, engine, tokenizer):
        built.append(kind)
        return real(cfg, kind, engine, tokenizer)

    monkeypatch.setattr(privileged, "skill_analyzer", counted)
    cfg = load_config(None, [*overrides(train_games, tmp_path), "algorithm=seed", "skill.analyzer=oracle",
                             "trainer.steps=2"])
    trainer = Trainer(cfg, policy_dir=tiny_policy)
    try:
        rows = trainer.run()
    finally:
        trainer.close()
    assert len(rows) == 2 and all("skill/parse_rate" in r for r in rows)
    assert built == ["oracle"]  # not once per step
