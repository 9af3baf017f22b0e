"""seedfast/seeds.py: every derived seed, pinned. The numbers are those the derivations gave before they moved into
one module (train/rl.py, train/evaluate.py, rollout/colocated.py, sft/, envs/): resumed runs, the overfit test and
the committed benchmark results depend on identical draws, so a change here must be a new function, never an edit
of these values."""

import ast
from pathlib import Path

import numpy as np

from seedfast import seeds

ROOT = Path(__file__).resolve().parents[1]


def test_step_seed_is_frozen():
    pairs = [(0, 0), (0, 1), (3, 5), (7, 1000), (2**31 - 2, 99)]
    assert [seeds.step_seed(s, t) for s, t in pairs] == [0, 7919, 3039604, 14919021, 2147267625]


def test_sampling_seed_per_data_parallel_rank_is_frozen():
    assert [seeds.sampling_seed(3, 5, r) for r in range(4)] == [3039604, 3144333, 3249062, 3353791]
    assert seeds.sampling_seed(3, 5) == seeds.step_seed(3, 5)  # one process: the step seed
    assert seeds.sampling_seed(2**31 - 2, 7, 3) == 2146853264
    assert seeds.analyzer_seed(3, 5, 2) == seeds.sampling_seed(3, 5, 2)


def test_update_and_evaluation_seeds_are_frozen():
    assert [seeds.update_seed(3, t) for t in (0, 5)] == [3000010, 3039605]
    assert seeds.eval_seed(11) == 11
    assert [seeds.eval_chunk_seed(11, k) for k in range(4)] == [11, 7930, 15849, 23768]
    assert seeds.eval_chunk_seed(2**31 - 2, 3) == 23756


def test_request_seeds_are_frozen():
    got = [seeds.request_seed(7, 0, 0), seeds.request_seed(7, 0, 1), seeds.request_seed(7, 1, 0),
           seeds.request_seed(2**31 - 2, 9, 999)]
    assert got == [1459280750, 1929599986, 1155116357, 569190949]


def test_task_draws_are_frozen():
    assert list(np.random.default_rng(seeds.task_pool_seed(5)).choice(10, size=3, replace=False)) == [1, 3, 8]
    assert list(np.random.default_rng(seeds.task_choice_seed(5, 2)).choice(10, size=3, replace=False)) == [7, 6, 2]


def test_skill_shuffle_draws_are_frozen():
    """skill.shuffle=derange's stream (docs/study.md, 'The shuffled-skill control'), tagged apart from the task
    draws."""
    assert seeds.skill_shuffle_seed(5, 0) == [5, 0, 0x5EED]
    assert list(np.random.default_rng(seeds.skill_shuffle_seed(5, 0)).permutation(8)) == [2, 6, 1, 3, 7, 4, 5, 0]
    assert list(np.random.default_rng(seeds.skill_shuffle_seed(11, 7)).permutation(8)) == [3, 2, 5, 0, 6, 1, 7, 4]


def test_sft_and_game_seeds_are_frozen():
    assert seeds.copy_warmup_seed(3, 4) == 3 * 1_000_003 + 4
    assert seeds.replay_seed(0, "g1") == "0:g1"
    assert seeds.first_game_seed(5, "train") == 5 and seeds.first_game_seed(5, "eval") == 1_000_005


def test_every_seed_stays_in_range():
    for s in (0, 1, 2**31 - 2):
        for t in (0, 1, 10**6):
            assert 0 <= seeds.step_seed(s, t) < seeds.MODULUS
            assert all(0 <= seeds.sampling_seed(s, t, r) < seeds.MODULUS for r in range(9))
            assert 0 <= seeds.eval_chunk_seed(s, t) < seeds.MODULUS
            assert 0 <= seeds.request_seed(s, t, t) < seeds.MODULUS


def _seedish(node: ast.AST) -> bool:
    """A variable whose name says it holds a seed (`seed`, `run_seed`, `cfg.run.seed`), or a call of a seed
    function (`step_seed(...)`); constants (`EVAL_SEED_OFFSET`) are spans, not seeds."""
    if isinstance(node, ast.Call):
        node = node.func
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return "seed" in name.lower() and not name.isupper()


GENERATORS = {"Random", "default_rng", "SeedSequence", "manual_seed", "seed", "Generator", "Sampler"}


def derivations_outside_seeds(root: Path) -> list[str]:
    """Seeds computed outside seeds.py: arithmetic on a seed (`seed + 104_729 * rank`, `step_seed(...) + 2`), or a
    seed built into a generator's argument (`Random(f"{seed}:{game}")`, `default_rng([seed, step])`)."""
    bad = []
    for path in sorted((root / "seedfast").rglob("*.py")):
        if path.name == "seeds.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.BinOp):
                parts = [node.left, node.right]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in GENERATORS:
                args = [*node.args, *(k.value for k in node.keywords)]
                parts = [v.value for a in args if isinstance(a, ast.JoinedStr) for v in a.values
                         if isinstance(v, ast.FormattedValue)]
                parts += [e for a in args if isinstance(a, ast.List | ast.Tuple) for e in a.elts]
            else:
                continue
            if any(_seedish(p) for p in parts):
                bad.append(f"{path.relative_to(root)}:{node.lineno}")
    return bad


def test_no_seed_is_derived_outside_seeds_module():
    bad = derivations_outside_seeds(ROOT)
    assert not bad, "derive seeds in seedfast/seeds.py (a named function with its why): " + ", ".join(bad)


def test_the_check_sees_ad_hoc_derivations(tmp_path):
    # guards the checker: the derivations seeds.py replaced, as they were written before
    (tmp_path / "seedfast").mkdir()
    (tmp_path / "seedfast" / "old.py").write_text(
        "def f(seed, step, rank, cfg, game_id):\n"
        "    a = (seed + 104_729 * rank) % (2**31 - 1)\n"
        "    b = step_seed(cfg.run.seed, step) + 2\n"
        "    c = np.random.default_rng([seed, 0x9001])\n"
        "    d = random.Random(f'{seed}:{game_id}')\n"
        "    e = f'{game_type}-L{level}-{seed}'  # a name, not a seed\n"
        "    return n <= EVAL_SEED_OFFSET // 2  # a span, not a seed\n")
    assert sorted(set(derivations_outside_seeds(tmp_path))) == [f"seedfast/old.py:{n}" for n in (2, 3, 4, 5)]
