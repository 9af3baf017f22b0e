"""The pre-registered study of issue #47: does SEED's teacher make an agent better? The protocol is docs/study.md (its
decisions are not this script's: where they and this script differ, the page wins and the difference is a bug).

    python -m experiments.study starts [--seeds 5 6 7 8 9 10 11]   # the SFT starts, made again (one thread)
    python -m experiments.study gap [--seeds 5 ... 11] [--pool P1]  # the teacher's own success, per seed
    python -m experiments.study pool                                # the pool rule over the gaps: study.json pool
    python -m experiments.study real-gap                            # SmolLM2's start: plain and oracle, 16 x 4
    python -m experiments.study select [--only gate/0.1 ...]        # λ per form at seed 11 (control, GRPO, 12)
    python -m experiments.study run [--seeds 5 ... 10] [--arms ...] # the seven arms, seed by seed
    python -m experiments.study report                              # analysis (the criterion) and study.png
    python -m experiments.study demo [--seeds 40 41 42 43 44]       # `seedfast demo` per seed in a fresh clone
    make docs                                                       # docs/study.md's "Result", from study.json

Every subcommand is resumable: a run, gap or start whose record is in experiments/results/study.json is skipped (a
record is written only when its run has finished, so a killed run is made again from its start, its run folder
cleared and a deviation recorded, as the protocol says). The file is rewritten whole under a lock, atomically (two
runs side by side, one torch thread each, are what the protocol's order allows). Every record carries its commit and
machine; the first record fixes `study_commit`, and a run at another commit, from a tree with changes to the code,
or on another kind of CPU is refused unless `--deviation "why"` records it as one. The demo check (step 8) runs
after the shipped configs' commit, so it is held to no study commit: it runs HEAD in a fresh clone, one commit and
one CPU per set of seeds.

Where the code reads the page (docs/study.md, 'Notes on the code' keeps the list): the gap's plays of one game are
one batch of 8 with the sampling seed seeds.sampling_seed(run.seed, game index), the same in every condition; a
skill is placed in the acting prompt by place_skills and the teacher's truncation rule (fit_step), so the acting
prompt is the teacher's prompt of train/batch.build_samples token for token.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import fcntl
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import git_commit, machine_info, versions, wrap_paragraph, write_json_atomic
from experiments import RESULTS_DIR, demo_seeds
from experiments.seed_sparse import AS_STUDIED
from experiments.seed_sparse import PER_UPDATE as SPARSE_PER_UPDATE

ROOT = Path(__file__).resolve().parents[1]
RESULT = RESULTS_DIR / "study.json"
PLOT = RESULTS_DIR / "study.png"
PROTOCOL = "docs/study.md"
CONFIG = "configs/demo_cpu.yaml"

SEEDS = (5, 6, 7, 8, 9, 10)  # the study's
SELECT_SEED = 11  # λ per form
ALL_SEEDS = (*SEEDS, SELECT_SEED)
# the candidate pools in the order the protocol measures them ('The teacher's own success, first')
POOLS = {
    "P1": ["env.levels=9-10", "env.games_dir=runs/sparse/games", "env.max_steps=6"],
    "P2": ["env.levels=9-10", "env.games_dir=runs/sparse/games", "env.max_steps=8"],
    "P3": ["env.levels=7-8", "env.games_dir=runs/sparse/games", "env.max_steps=6"],
}
FORMS = ("gate", "advantage", "reverse_kl")  # also the primary form's tie order
ARMS = ("control", "grpo", *FORMS, "shuffled", "self")
GRID = {"gate": (0.01, 0.03, 0.1, 0.3), "advantage": (0.1, 0.3, 1.0, 3.0), "reverse_kl": (0.03, 0.1, 0.3, 1.0)}
STEPS = 16
MARGIN = 0.05  # clause 1: d̄ >= +0.05
POSITIVE = 5  # clause 2: d_s > 0 at >= 5 of the 6 seeds
HELDOUT_FLOOR = -0.03  # clause 4
TIE = 0.010  # λ selection and the primary form: within 0.010 of the highest
TIE_EPS = 1e-9  # float slack on the tie (statistics are means of k/64)
GAP_PLAYS = 8
CONDITIONS = ("plain", "oracle", "own", "shuffled")
# the pool rule: the oracle gap's interval above 0 at >= 5 of seeds 5-10; plain success <= 0.25 and mixed groups
# <= 0.60 on average over seeds 5-10
POOL_RULE = {"oracle_above": 5, "plain_success": 0.25, "mixed_groups": 0.60}
PER_UPDATE = (*SPARSE_PER_UPDATE, "rollout/invalid_rate", "loss/opd_term", "loss/opd_loss", "loss/gate_mean",
              "loss/teacher_valid_frac", "skill/shuffled", "skill/shuffle_games", "skill/shuffle_mask_moved",
              "skill/shuffle_unshuffled")
EVIDENCE = ("teacher/contrast", "teacher/raised_win", "teacher/raised_lose", "teacher/opd_share", "skill/parse_rate",
            "loss/opd_term")
HELDOUT_KEYS = ("eval/success_rate", "eval/episode_length", "eval/invalid_rate")
REAL_MODEL = {"teacher_probe": "teacher_probe.json probes -> smollm2_sparse_s1",
              "runs": {form: f"real_model_sparse.json runs -> study_{form}" for form in FORMS}}


# ------------------------------------------------------------------ statistics


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: int) -> float:
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (no scipy in the lock): bisection on the CDF; t_quantile(0.975, 5) = 2.5706."""
    if not 0.5 <= p < 1.0:
        raise ValueError(f"p must be in [0.5, 1), got {p}")
    lo, hi = 0.0, 1e4
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def interval(values: Sequence[float]) -> dict:
    """The mean, the sample standard deviation (divisor n - 1) and the 95% t-interval mean ± t(0.975, n-1)·s/√n."""
    n = len(values)
    m = mean(values)
    if n < 2:
        return {"mean": m, "sd": None, "n": n, "df": None, "t": None, "ci95": [None, None]}
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    t = t_quantile(0.975, n - 1)
    half = t * sd / math.sqrt(n)
    return {"mean": m, "sd": sd, "n": n, "df": n - 1, "t": t, "ci95": [m - half, m + half]}


def pool_success(record: dict, first: int = 4, last: int = STEPS) -> float:
    """Mean pool success over updates first..last (1-based, inclusive): 4-16 for the criterion, 1-8 for λ."""
    return mean(record["per_update"]["train/success_rate"][first - 1:last])


def wins(record: dict) -> list[int]:
    """Pool wins per update: the success share times the update's episodes (8 games x 8)."""
    n = record.get("episodes_per_update", 64)
    return [round(v * n) for v in record["per_update"]["train/success_rate"]]


def collapse(record: dict, control: dict | None, start_heldout: float | None) -> dict[str, bool]:
    """The protocol's three collapse rules ('The criterion'), each flagged:
    1. over some 4 consecutive updates among 4-16 the run's pool wins are fewer than a quarter of the control's on the
       same draws, where the control wins at least 8 of those episodes;
    2. its held-out success after RL is below half of its SFT start's;
    3. its invalid-action share is above 0.5 at 4 consecutive updates (any updates)."""
    flags = {"1": False, "2": False, "3": False}
    if control is not None:
        mine, theirs = wins(record), wins(control)
        for first in range(3, min(len(mine), len(theirs)) - 3):  # 0-based start of a window within updates 4-16
            arm, ctl = sum(mine[first:first + 4]), sum(theirs[first:first + 4])
            if ctl >= 8 and arm < ctl / 4:
                flags["1"] = True
    after = (record.get("heldout_after") or {}).get("eval/success_rate")
    if after is not None and start_heldout is not None and after < start_heldout / 2:
        flags["2"] = True
    invalid = [v for v in record["per_update"].get("rollout/invalid_rate", []) if v is not None]
    flags["3"] = any(all(v > 0.5 for v in invalid[i:i + 4]) for i in range(len(invalid) - 3))
    return flags


def choose_lambda(statistic: dict[float, float], collapsed: set[float]) -> tuple[float, bool]:
    """λ of one form: the highest statistic among the candidates that did not collapse; of those within TIE of it,
    the smallest λ. Every candidate collapsed: the smallest λ, flagged (True)."""
    alive = {lam: s for lam, s in statistic.items() if lam not in collapsed}
    if not alive:
        return min(statistic), True
    best = max(alive.values())
    return min(lam for lam, s in alive.items() if s >= best - TIE - TIE_EPS), False


def choose_primary(statistic: dict[str, float]) -> str:
    """The form whose chosen λ has the highest statistic; within TIE, the first of FORMS."""
    best = max(statistic.values())
    return next(f for f in FORMS if f in statistic and statistic[f] >= best - TIE - TIE_EPS)


# ------------------------------------------------------------------ the results file


def _base() -> dict:
    return {"experiment": "study", "protocol": {"doc": PROTOCOL, "commit": protocol_commit()}, "study_commit": None,
            "machine": None, "versions": None, "pool": None, "teacher_gap": {}, "starts": {}, "selection": None,
            "runs": {}, "analysis": None, "real_model": REAL_MODEL, "demo_check": None, "deviations": []}


def protocol_commit() -> str | None:
    out = subprocess.run(["git", "log", "-1", "--format=%H", "--", PROTOCOL], capture_output=True, text=True,
                         cwd=ROOT, check=False)
    return out.stdout.strip() or None


def load(result: Path | None = None) -> dict:
    result = result or RESULT
    return json.loads(result.read_text(encoding="utf-8")) if result.exists() else _base()


@contextlib.contextmanager
def locked(result: Path | None = None):
    """study.json (or the study worktree's, `result`) read and rewritten under an exclusive lock (two runs may finish
    at once), written whole to a temporary file and renamed into place (benchmarks/common.write_json_atomic)."""
    result = result or RESULT
    result.parent.mkdir(parents=True, exist_ok=True)
    with open(result.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = load(result)
        yield data
        write_json_atomic(result, data)


def deviation(data: dict, what: str, why: str) -> None:
    data.setdefault("deviations", []).append({
        "what": what, "why": why, "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})


def code_changes() -> list[str]:
    """Tracked files changed in the tree that a run reads (the package, the experiments, the configs, benchmarks'
    helpers), results left out."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "seedfast", "experiments",
                          "configs", "benchmarks"], capture_output=True, text=True, cwd=ROOT, check=False)
    paths = [line[3:] for line in out.stdout.splitlines() if line.strip()]
    return [p for p in paths if not p.startswith("experiments/results/")]  # the study's own file is not code


def check_study_commit(what: str, allow: str | None) -> None:
    """One commit, one machine: the first record fixes study_commit and the machine; a run at another commit, with
    code changes, or on another CPU is refused, or recorded as a deviation when `allow` says why."""
    commit, changes, cpu = git_commit(), code_changes(), machine_info().get("cpu")
    with locked() as data:
        if data["study_commit"] is None:
            data["study_commit"], data["machine"] = commit, machine_info()
            data["versions"] = versions("torch", "seedfast", "textworld")
        problems = []
        if commit != data["study_commit"]:
            problems.append(f"HEAD is {commit}, the study commit {data['study_commit']}")
        if changes:
            problems.append(f"the tree changes {', '.join(changes[:5])}")
        if data["machine"] and cpu != data["machine"].get("cpu"):
            problems.append(f"the CPU is {cpu!r}, the study's {data['machine'].get('cpu')!r}")
        if problems and allow is None:
            rule = "docs/study.md, 'One commit, one machine, one file'"
            raise SystemExit(f"study: {what}: {'; '.join(problems)} ({rule}); run from the study's worktree, or pass "
                             "--deviation WHY to record it as one")
        if problems:
            deviation(data, f"{what}: {'; '.join(problems)}", allow)


# ------------------------------------------------------------------ configs


def recipe(seed: int, pool: str) -> list[str]:
    """The recipe's overrides in the protocol's order ('The pool and the recipe')."""
    return ["log.progress=false", "log.tensorboard=false", f"run.name=study_sparse_s{seed}", f"run.seed={seed}",
            f"trainer.steps={STEPS}", *AS_STUDIED, *POOLS[pool]]


def teacher_params(form: str) -> str:
    """`old` (the protocol's), unless the trainer at this commit refuses it with the form: then `current`, as the
    protocol decides for reverse_kl ('The arms'; recorded in the run's overrides)."""
    from seedfast.config import ConfigError, load_config
    from seedfast.train.step_plan import plan_step

    try:
        plan_step(load_config(ROOT / CONFIG, ["algorithm=seed", "skill.teacher_params=old", f"loss.opd_mode={form}"]))
    except (ConfigError, ValueError):
        return "current"
    return "old"


def form_overrides(form: str, lam: float) -> list[str]:
    return ["algorithm=seed", "skill.analyzer=oracle", f"skill.teacher_params={teacher_params(form)}",
            f"loss.opd_mode={form}", f"loss.opd_coef={lam:g}"]


def arm_overrides(arm: str, selection: dict | None) -> list[str]:
    """The arm's overrides on top of the recipe ('The arms'): the forms at their chosen λ, shuffled and self at the
    primary's form and λ."""
    if arm == "control":
        return ["algorithm=grpo", "loss.kl_coef=0.0"]
    if arm == "grpo":
        return ["algorithm=grpo"]
    if selection is None:
        raise SystemExit(f"study: arm {arm} needs λ per form: run `python -m experiments.study select` first")
    if arm in FORMS:
        return form_overrides(arm, selection["chosen"][arm])
    primary = selection["primary"]
    base = form_overrides(primary, selection["chosen"][primary])
    if arm == "shuffled":
        return [*base, "skill.shuffle=derange"]
    if arm == "self":
        return [o if not o.startswith("skill.analyzer=") else "skill.analyzer=self" for o in base]
    raise SystemExit(f"study: --arms {arm!r} is not one of {ARMS}")


def sft_dir(seed: int) -> Path:
    return ROOT / "runs" / f"sparse_sft_s{seed}" / "sft"


# ------------------------------------------------------------------ starts


def sft_command(seed: int) -> list[str]:
    """The protocol's SFT start ('The SFT starts'), run with OMP_NUM_THREADS=1."""
    return [sys.executable, "-m", "seedfast", "sft", CONFIG, f"run.name=sparse_sft_s{seed}", f"run.seed={seed}",
            "env.games_dir=runs/sparse/games", "sft.copy_warmup_steps=800", "env.n_eval=32", "sft.max_seconds=null"]


def games_command() -> list[str]:
    """The SFT games (the config's levels) in the study's games folder: `seedfast sft` reads a manifest and does not
    generate (RL makes the levels 9-10 games itself); cached, so a second call makes nothing."""
    return [sys.executable, "-m", "seedfast", "envs", "make", CONFIG, "env.games_dir=runs/sparse/games",
            "env.n_eval=32"]


def make_start(seed: int, allow: str | None) -> None:
    key = f"sparse/s{seed}"
    if load()["starts"].get(key, {}).get("sft") and (sft_dir(seed) / "config.json").exists():
        print(f"{key}: SFT start already made at the study commit, skipped")
        return
    check_study_commit(f"SFT start s{seed}", allow)
    run_dir = sft_dir(seed).parent
    if run_dir.exists():  # a start made before the study (or an unfinished one): kept aside, never reused
        aside = run_dir.with_name(f"{run_dir.name}.before_study_{int(time.time())}")
        run_dir.rename(aside)
        print(f"{key}: {run_dir} moved to {aside}; the start is made again")
    t0 = time.perf_counter()
    subprocess.run(games_command(), cwd=ROOT, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    subprocess.run(sft_command(seed), cwd=ROOT, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    with locked() as data:
        data["starts"].setdefault(key, {})["sft"] = {
            "command": " ".join(["seedfast", *sft_command(seed)[3:]]), "policy": str(sft_dir(seed).relative_to(ROOT)),
            "wall_s": round(time.perf_counter() - t0, 1), "git_commit": git_commit(), "machine": machine_info()}


# ------------------------------------------------------------------ the teacher's own success (gap)


def skill_prompt(cfg, ids, prompt, skill: tuple[str | None, dict[int, str]] | None, step_index: int
                 ) -> tuple[list[int], bool]:
    """The acting prompt with `skill` (episode text, {step: text}) placed as train/batch.build_samples places it for
    the teacher (place_skills at skill.insertion, the truncation rule of fit_step), and whether the skill was left
    out (too long even without history). No skill: the plain prompt."""
    from seedfast.context.teacher import build_step_sample, fit_step, place_skills

    if skill is None:
        return list(prompt.ids), False
    episode, steps = skill
    placed = place_skills(prompt.insert_points(), cfg.skill.insertion, episode, steps.get(step_index),
                          cfg.skill.teacher_mode)
    pieces = [(mode, ids(text)) for mode, text in placed]
    if not pieces:
        return list(prompt.ids), False
    # the teacher's limit is rollout.max_prompt_length plus the response, counted with it: the same limit on P ⊕ S
    # (a placeholder response, not counted)
    fit = fit_step(lambda skills, **kw: build_step_sample(prompt.segments, [0], skills, count_response=False, **kw),
                   pieces, cfg.rollout.max_prompt_length, 0)
    return fit.sample.teacher_prompt_ids().tolist(), fit.too_long


def play(engine, tokenizer, task, envs, config, cfg, skill, acting: list | None = None):
    """RL's agent loop (rollout/agent_loop.run_agent_loop, through its own steps) on one game's `config.n` plays, with
    `skill` in every acting prompt (skill_prompt); `acting` collects each step's acting prompt ids in the order of
    the result's step records. Returns (RolloutResult, steps whose skill was left out)."""
    from seedfast.context.skill import SkillIds
    from seedfast.rollout import agent_loop as loop
    from seedfast.rollout.agent_loop import stop_token_ids
    from seedfast.rollout.records import RolloutStats
    from seedfast.sampling_params import SamplingParams

    ids = SkillIds(tokenizer, max_tokens=cfg.skill.max_skill_tokens)
    params = SamplingParams(config.max_new_tokens, config.temperature, config.top_p, stop_token_ids(tokenizer))
    stats, left_out = RolloutStats(), 0
    episodes = loop._start([task], envs, range(config.n), config.n, stats)
    shown: dict[int, list[list[int]]] = {e.index: [] for e in episodes}
    for step_index in range(config.max_steps):
        live = [e for e in episodes if not e.done]
        if not live:
            break
        prompts = [loop._prompt(tokenizer, e, step_index, config, stats) for e in live]
        placed = [skill_prompt(cfg, ids, p, skill, step_index) for p in prompts]
        left_out += sum(out for _, out in placed)
        generations = engine.generate_full([p for p, _ in placed], params)
        stats.generate_calls += 1
        texts = tokenizer.batch_decode([g.token_ids for g in generations], skip_special_tokens=True)
        actions = [loop.parse_action(text) for text in texts]
        outcomes = envs.step({e.slot: a for e, a in zip(live, actions) if a is not None})
        for episode, prompt, (acted, _), generation, text, action in zip(live, prompts, placed, generations, texts,
                                                                          actions):
            shown[episode.index].append(acted)
            outcome = outcomes[episode.slot] if action is not None else None
            loop._advance(episode, prompt, generation, text, action, outcome, step_index, stats)
    for episode in episodes:
        if not episode.done:
            stats.truncated += 1
            episode.trajectory.meta["truncated"] = True
    result = loop._finish(episodes, config, stats)
    if acting is not None:
        for record in result.steps:
            acting.append(shown[record.trajectory_index][record.step_index])
    return result, left_out


def walkthrough_skills(cfg, tasks, run_seed: int) -> tuple[list, list[tuple[str | None, dict[int, str]] | None]]:
    """Each game's walkthrough replayed (sft/replay) and the oracle analyzer's skill of it, as the teacher takes it
    (teacher_probe's `oracle_win`)."""
    from seedfast.sft.replay import replay_games
    from seedfast.skills.analyzers import OracleAnalyzer
    from seedfast.skills.result import teacher_texts

    walks = [g.success for g in replay_games(tasks, failures=False, seed=run_seed)]
    results = OracleAnalyzer(cfg.skill.skill_mode).analyze(walks)
    return walks, [teacher_texts(r, cfg.skill.skill_mode) if r.valid else None for r in results]


def own_skills(cfg, policy, tokenizer, walks) -> list[tuple[str | None, dict[int, str]] | None]:
    """The start's own greedy analysis of each walkthrough (teacher_probe's `self_win`), None where it does not
    parse."""
    from seedfast.rollout.own_engine import Sampler
    from seedfast.sft.examples import end_of_turn_id
    from seedfast.skills.analyzers import SelfAnalyzer
    from seedfast.skills.result import teacher_texts

    analyzer = SelfAnalyzer(Sampler(policy, seed=0), tokenizer, cfg.skill.skill_mode,
                            max_new_tokens=cfg.skill.max_analysis_tokens,
                            max_prompt_tokens=cfg.rollout.max_prompt_length, stop_ids=[end_of_turn_id(tokenizer)])
    return [teacher_texts(r, cfg.skill.skill_mode) if r.valid else None for r in analyzer.analyze(walks)]


def condition_summary(results: list) -> dict:
    """success, invalid-action share, episode length and the share of games whose plays hold a win and a loss."""
    plays = [t for r in results for t in r.trajectories]
    steps = sum(r.stats.steps for r in results)
    mixed = [0 < sum(t.won for t in r.trajectories) < len(r.trajectories) for r in results]
    return {"success": mean([float(t.won) for t in plays]),
            "invalid_rate": sum(r.stats.invalid_actions for r in results) / steps if steps else 0.0,
            "episode_length": mean([len(t.steps) for t in plays]), "mixed_groups": mean([float(m) for m in mixed]),
            "games": len(results), "episodes": len(plays)}


def gap_check(cfg, policy_dir: Path, tasks: list, plays: int, run_seed: int, acting: dict | None = None,
              conditions: Sequence[str] = CONDITIONS) -> dict:
    """The teacher's own success ('The teacher's own success, first'): each game of `tasks` played `plays` times per
    condition (`conditions`: plain first, then any of oracle, own, shuffled) by the policy at `policy_dir` at
    rollout.temperature, the plays of a game one batch with the sampling seed seeds.sampling_seed(run_seed, game
    index) in every condition; per condition the success, invalid share, episode length and mixed groups; per skill
    condition the gap (mean over games of the success with the skill minus plain, 95% t-interval over games).
    `acting` (optional): condition -> a list that gets, per game, (result, acting prompt ids per step record)."""
    import numpy as np

    from seedfast.rollout.colocated import build_rollout
    from seedfast.runtime.setup import agent_config, device_of, load_policy, load_run_tokenizer, make_env_slots
    from seedfast.seeds import sampling_seed, skill_shuffle_seed
    from seedfast.train.privileged import derangement

    if not conditions or conditions[0] != "plain" or any(c not in CONDITIONS[1:] for c in conditions[1:]):
        raise ValueError(f"gap_check: conditions {list(conditions)}: plain first, then any of {CONDITIONS[1:]}")
    t0 = time.perf_counter()
    policy = load_policy(cfg, policy_dir, device_of(cfg), trainable=False)
    tokenizer = load_run_tokenizer(cfg, policy_dir)
    walks, oracle = walkthrough_skills(cfg, tasks, run_seed)
    own = own_skills(cfg, policy, tokenizer, walks) if "own" in conditions else None
    perm = derangement(np.random.default_rng(skill_shuffle_seed(run_seed, 0)), len(tasks))
    skills = {"plain": [None] * len(tasks), "oracle": oracle, "own": own, "shuffled": [oracle[p] for p in perm]}
    engine = build_rollout("own", policy, seed=run_seed)
    envs = make_env_slots(cfg, plays)
    config = agent_config(cfg, n=plays, temperature=cfg.rollout.temperature)
    won: dict[str, list[float | None]] = {c: [] for c in conditions}
    results: dict[str, list] = {c: [] for c in conditions}
    left_out = dict.fromkeys(conditions, 0)
    try:
        for i, task in enumerate(tasks):
            for c in conditions:
                if c != "plain" and skills[c][i] is None:  # own: an analysis that did not parse
                    won[c].append(None)
                    continue
                engine.begin_step(sampling_seed(run_seed, i))
                shown: list | None = [] if acting is not None else None
                result, out = play(engine, tokenizer, task, envs, config, cfg, skills[c][i], shown)
                left_out[c] += out
                results[c].append(result)
                won[c].append(mean([float(t.won) for t in result.trajectories]))
                if acting is not None:
                    acting.setdefault(c, []).append((result, shown))
    finally:
        envs.close()
    summaries = {c: {**condition_summary(results[c]), "skill_left_out_steps": left_out[c]} for c in conditions}
    if own is not None:
        summaries["own"]["parse_share"] = sum(s is not None for s in own) / len(tasks)
    gaps = {}
    for c in conditions[1:]:
        diffs = [w - p for w, p in zip(won[c], won["plain"]) if w is not None]
        stats = interval(diffs)
        gaps[c] = {"mean": stats["mean"], "ci95": stats["ci95"], "games": len(diffs), "df": stats["df"],
                   "t": stats["t"]}
    return {"policy": str(policy_dir), "games": len(tasks), "plays": plays, "temperature": cfg.rollout.temperature,
            "max_steps": cfg.env.max_steps, "conditions": summaries, "gaps": gaps,
            "per_game": {"game_ids": [t.game_id for t in tasks], **{c: won[c] for c in conditions},
                         **({"shuffled_from": [tasks[p].game_id for p in perm]} if "shuffled" in conditions else {})},
            "git_commit": git_commit(), "machine": machine_info(), "wall_s": round(time.perf_counter() - t0, 1)}


def gap(seed: int, pool: str, allow: str | None) -> dict | None:
    from seedfast.config import load_config
    from seedfast.runtime.setup import load_tasks
    from seedfast.train.draws import task_pool

    key = f"{pool}/s{seed}"
    if key in load()["teacher_gap"]:
        print(f"teacher gap {key}: recorded, skipped")
        return None
    if not (sft_dir(seed) / "config.json").exists():
        raise SystemExit(f"study: no SFT start in {sft_dir(seed)}: `python -m experiments.study starts` first")
    check_study_commit(f"teacher gap {key}", allow)
    cfg = load_config(ROOT / CONFIG, [*recipe(seed, pool), "algorithm=grpo", "loss.kl_coef=0.0"])
    load_tasks(cfg, "eval", generate=True)  # the first run that needs the pool's games makes them (both splits)
    tasks = task_pool(load_tasks(cfg, "train", generate=True), cfg.rollout.task_pool, cfg.run.seed)
    record = gap_check(cfg, sft_dir(seed), tasks, GAP_PLAYS, seed)
    record["policy"] = str(sft_dir(seed).relative_to(ROOT))
    return land_gap(key, record)


def land_gap(key: str, record: dict) -> dict:
    """A gap check's record into study.json's teacher_gap under `key`, and its line on the console."""
    with locked() as data:
        data["teacher_gap"][key] = record
    g = record["gaps"]
    print(f"teacher gap {key}: plain success {record['conditions']['plain']['success']:.3f}; "
          + "; ".join(f"{c} {g[c]['mean']:+.3f} [{_f(g[c]['ci95'][0])}, {_f(g[c]['ci95'][1])}]" for c in g)
          + f"; {record['wall_s']} s")
    return record


# the real model's gap ('The real model: SmolLM2-135M', step 3): the start of its first sparse run (`gate`), its 16
# pool games x 4 plays at the recipe's rollout temperature, plain and oracle only
REAL_GAP = {"key": "smollm2/s1", "config": "configs/smollm2-135m_textworld_cpu.yaml", "seed": 1,
            "start": "runs/smollm2-135m_textworld_cpu_sparse_study_gate_seed1/sft", "plays": 4,
            "conditions": ("plain", "oracle"),
            "overrides": ["env.levels=7-8", "env.max_steps=6", "env.n_train=8", "env.n_eval=12",
                          "env.games_dir=runs/smollm2_sparse/games", "rollout.task_pool=16"]}


def real_gap(allow: str | None) -> dict | None:
    """Step 3 of the real model: the teacher gap of SmolLM2's sparse start, into study.json's teacher_gap under
    REAL_GAP's key (read as a description, never against the criterion)."""
    from seedfast.config import load_config
    from seedfast.runtime.setup import load_tasks
    from seedfast.train.draws import task_pool

    key, start = REAL_GAP["key"], ROOT / REAL_GAP["start"]
    if key in load()["teacher_gap"]:
        print(f"teacher gap {key}: recorded, skipped")
        return None
    if not (start / "config.json").exists():
        raise SystemExit(f"study: no SFT start in {start}: the real model's first sparse run (`gate`) makes it "
                         "(docs/study.md, 'The real model: SmolLM2-135M')")
    check_study_commit(f"teacher gap {key}", allow)
    cfg = load_config(ROOT / REAL_GAP["config"], [f"run.seed={REAL_GAP['seed']}", *REAL_GAP["overrides"],
                                                  "algorithm=grpo"])
    tasks = task_pool(load_tasks(cfg, "train", generate=True), cfg.rollout.task_pool, cfg.run.seed)
    record = gap_check(cfg, start, tasks, REAL_GAP["plays"], cfg.run.seed, conditions=REAL_GAP["conditions"])
    record["policy"] = REAL_GAP["start"]
    return land_gap(key, record)


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def pool_verdict(gaps: dict, pool: str) -> dict:
    """The pool rule over seeds 5-10 of `pool`: (1) the oracle gap's interval above 0 at >= 5 seeds, (2) plain
    success <= 0.25 and mixed groups <= 0.60 on average. None until all six seeds are measured."""
    have = [gaps.get(f"{pool}/s{s}") for s in SEEDS]
    if any(h is None for h in have):
        return {"pool": pool, "complete": False, "passes": None}
    above = sum((h["gaps"]["oracle"]["ci95"][0] or -1) > 0 for h in have)
    plain = mean([h["conditions"]["plain"]["success"] for h in have])
    mixed = mean([h["conditions"]["plain"]["mixed_groups"] for h in have])
    passes = (above >= POOL_RULE["oracle_above"] and plain <= POOL_RULE["plain_success"]
              and mixed <= POOL_RULE["mixed_groups"])
    return {"pool": pool, "complete": True, "passes": passes, "oracle_above_zero": above, "plain_success": plain,
            "mixed_groups": mixed}


def decide_pool() -> dict:
    """The first of P1, P2, P3 that passes; none passing of the three measured: P1, said."""
    with locked() as data:
        verdicts = [pool_verdict(data["teacher_gap"], p) for p in POOLS]
        chosen, note = None, ""
        for v in verdicts:
            if not v["complete"]:
                raise SystemExit(f"study: pool {v['pool']} is not measured at seeds 5-10 yet "
                                 f"(python -m experiments.study gap --pool {v['pool']})")
            if v["passes"]:
                chosen = v["pool"]
                break
        if chosen is None:
            chosen, note = "P1", "no pool passed: the teacher does not act better than the policy there"
        data["pool"] = {"name": chosen, "overrides": POOLS[chosen], "decided_by": "teacher_gap",
                        "verdicts": [v for v in verdicts if v["complete"]], **({"note": note} if note else {})}
        return data["pool"]


# ------------------------------------------------------------------ runs (select, run)


def start_heldout(cfg, seed: int, pool: str) -> dict:
    """The SFT start's held-out evaluation in the pool (once per seed and pool, kept under starts)."""
    from seedfast.runtime.setup import device_of, load_policy, load_run_tokenizer
    from seedfast.train.evaluate import evaluate_policy

    key = f"sparse/s{seed}"
    known = load()["starts"].get(key, {})
    if known.get("pool") == pool and "eval/success_rate" in known:
        return {k: known[k] for k in HELDOUT_KEYS if k in known}
    start = load_policy(cfg, sft_dir(seed), device_of(cfg), trainable=False)
    ev = evaluate_policy(cfg, start, load_run_tokenizer(cfg, sft_dir(seed)), "eval")
    before = {k: ev[k] for k in HELDOUT_KEYS if k in ev}
    with locked() as data:
        data["starts"].setdefault(key, {}).update({"pool": pool, **before})
    return before


def run_one(key: str, seed: int, pool: str, arm: str, overrides: list[str], force: bool = False) -> dict | None:
    """One run of 16 updates from the seed's SFT start (seed_sparse.run's, with the study's arms and file); its
    record under runs[key]. A record already there: skipped. A run folder without a record (a run killed before it
    finished): cleared, made again from its start, and recorded as a deviation."""
    from seedfast.config import load_config
    from seedfast.train.rl import Trainer

    if key in load()["runs"] and not force:
        print(f"{key}: recorded, skipped")
        return None
    all_overrides = [*recipe(seed, pool), *overrides]
    cfg = load_config(ROOT / CONFIG, all_overrides)
    if not (sft_dir(seed) / "config.json").exists():
        raise SystemExit(f"study: no SFT start in {sft_dir(seed)}: `python -m experiments.study starts` first")
    before = start_heldout(cfg, seed, pool)
    run_dir = cfg.run_dir / key.replace("/", "_")
    if run_dir.exists():
        shutil.rmtree(run_dir)
        with locked() as data:
            deviation(data, f"{key} made again from its start", "its run folder existed without a record (a run "
                      "killed or crashed before it finished)")
    t0 = time.perf_counter()
    if arm == "control":
        trainer = Trainer(cfg, policy_dir=sft_dir(seed), run_dir=run_dir)
    else:
        sub = copy.deepcopy(cfg)
        sub.trainer.init_from = str(sft_dir(seed))
        trainer = Trainer(sub, policy_dir=sft_dir(seed), run_dir=run_dir)
    try:
        history = trainer.control_run() if arm == "control" else trainer.run()
    finally:
        trainer.close()
    last = history[-1]
    record = {
        "seed": seed, "pool": pool, "arm": arm, "form": cfg.loss.opd_mode if cfg.algorithm == "seed" else None,
        "lam": cfg.loss.opd_coef if cfg.algorithm == "seed" else None,
        "teacher": cfg.skill.teacher_params if cfg.algorithm == "seed" else None,
        "analyzer": cfg.skill.analyzer if cfg.algorithm == "seed" else None, "shuffle": cfg.skill.shuffle,
        "sft_run": f"sparse_sft_s{seed}", "overrides": all_overrides, "updates": len(history),
        "episodes_per_update": cfg.rollout.tasks_per_batch * cfg.rollout.n,
        "per_update": {k: [r.get(k) for r in history] for k in PER_UPDATE if any(k in r for r in history)},
        "heldout_before": before,
        "heldout_after": None if arm == "control" else {k: last[k] for k in HELDOUT_KEYS if k in last},
        "heldout_games": cfg.trainer.eval_games, "heldout_repeats": cfg.trainer.eval_repeats,
        "wall_s": round(time.perf_counter() - t0, 1), "git_commit": git_commit(), "machine": machine_info(),
        "versions": versions("torch", "seedfast"),
    }
    with locked() as data:
        data["runs"][key] = record
    curve = record["per_update"]["train/success_rate"]
    print(f"{key}: pool success {' '.join(f'{v:.2f}' for v in curve)}; 4-16 {pool_success(record):.3f}; "
          f"{record['wall_s']} s")
    return record


def decided_pool() -> str:
    pool = load()["pool"]
    if pool is None:
        raise SystemExit("study: no pool decided yet: the teacher gap first (gap, then pool)")
    return pool["name"]


def selection_keys() -> list[tuple[str, str, list[str]]]:
    """(key, arm, overrides) of seed 11's runs: control, GRPO, then each form's candidates."""
    out = [(f"select/s{SELECT_SEED}/control", "control", arm_overrides("control", None)),
           (f"select/s{SELECT_SEED}/grpo", "grpo", arm_overrides("grpo", None))]
    for form in FORMS:
        for lam in GRID[form]:
            out.append((f"select/s{SELECT_SEED}/{form}_lam{lam:g}", form, form_overrides(form, lam)))
    return out


def selection(runs: dict, start: dict | None) -> dict | None:
    """λ per form and the primary form from seed 11's runs ('λ per form'); None until every candidate is in."""
    control = runs.get(f"select/s{SELECT_SEED}/control")
    stat, collapsed, flags, chosen, all_collapsed = {}, [], {}, {}, []
    for form in FORMS:
        per = {}
        for lam in GRID[form]:
            key = f"select/s{SELECT_SEED}/{form}_lam{lam:g}"
            if key not in runs:
                return None
            per[lam] = stat[f"{form}/{lam:g}"] = pool_success(runs[key], 1, 8)
            flags[f"{form}/{lam:g}"] = collapse(runs[key], control, (start or {}).get("eval/success_rate"))
            if any(flags[f"{form}/{lam:g}"].values()):
                collapsed.append(f"{form}/{lam:g}")
        chosen[form], every = choose_lambda(per, {lam for lam in per if f"{form}/{lam:g}" in collapsed})
        if every:
            all_collapsed.append(form)
    primary = choose_primary({f: stat[f"{f}/{chosen[f]:g}"] for f in FORMS})
    return {"seed": SELECT_SEED, "grid": {f: list(GRID[f]) for f in FORMS}, "statistic": stat,
            "collapsed": collapsed, "collapse_rules": flags, "all_collapsed": all_collapsed, "chosen": chosen,
            "primary": primary}


def select(only: list[str] | None, allow: str | None) -> dict | None:
    pool = decided_pool()
    for key, arm, overrides in selection_keys():
        name = key.rsplit("/", 1)[1].replace("_lam", "/")
        if only and name not in only and key.rsplit("/", 1)[1] not in only:
            continue
        if key in load()["runs"]:
            print(f"{key}: recorded, skipped")
            continue
        check_study_commit(key, allow)
        run_one(key, SELECT_SEED, pool, arm, overrides)
    data = load()
    chosen = selection(data["runs"], data["starts"].get(f"sparse/s{SELECT_SEED}"))
    if chosen is None:
        print("selection: not every candidate is in yet")
        return None
    with locked() as data:
        if data["selection"] is not None and data["selection"]["chosen"] != chosen["chosen"]:
            raise SystemExit("study: the selection is fixed and the runs now give another: not overwritten")
        data["selection"] = chosen
    print(f"selection: {chosen['chosen']}, primary {chosen['primary']}")
    return chosen


def run_arms(seeds: Sequence[int], arms: Sequence[str], allow: str | None) -> None:
    """The arms at each seed, seed by seed (a seed's arms finish before the next seed starts)."""
    pool = decided_pool()
    chosen = load()["selection"]
    for seed in seeds:
        for arm in arms:
            key = f"sparse/s{seed}/{arm}"
            if key in load()["runs"]:
                print(f"{key}: recorded, skipped")
                continue
            overrides = arm_overrides(arm, chosen)
            check_study_commit(key, allow)
            run_one(key, seed, pool, arm, overrides)


# ------------------------------------------------------------------ the demo at seeds 40-44


DEMO_SETS = {"check": (40, 41, 42, 43, 44), "confirmation": (45, 46, 47, 48, 49)}
DEMO_PASS_SEEDS = 4  # the demo passes at >= 4 of the 5 seeds
DEMO_SE = 2.0  # held-out: the change from the SFT start >= -2 SE
# the fresh-clone budget: 10 minutes (docs/demo.md), 15 for a changed recipe confirmed at 45-49
DEMO_BUDGET_S = {"check": demo_seeds.BUDGET_S, "confirmation": 15 * 60}
FRESH_REFERENCE = RESULTS_DIR / f"{demo_seeds.FRESH}.json"  # the copy warm-up the box's speed is read against
# left out of the demo's environment: `make demo` runs with the box's default threads, whatever the study's runs use
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
RECIPE_PATHS = ("configs", "seedfast")  # where a changed recipe can be


def demo_seed_check(summary: dict) -> dict:
    """One seed against the protocol's rule ('The demo at seeds 40–44'), from its demo_summary.json: for each
    algorithm the demo trains, pool = its last-half pool success minus the control's (passes if > 0) and held-out =
    its held-out success after RL minus the SFT start's (passes if >= -2 SE, SE = change_standard_error at the
    start's held-out success p over the evaluation's games x plays). The seed passes if every algorithm passes both."""
    p = summary["before"]["eval/success_rate"]
    held = summary["held_out"]
    se = demo_seeds.change_standard_error(p, held["games"], held["plays"])
    control = summary["means"]["control"]["last_half"]
    algorithms = {}
    for name, after in summary["after"].items():
        lead = summary["means"][name]["last_half"] - control
        change = after["eval/success_rate"] - p
        algorithms[name] = {"pool_last_half": summary["means"][name]["last_half"], "pool_lead": lead,
                            "pool_passes": lead > 0, "heldout_after": after["eval/success_rate"],
                            "heldout_change": change, "heldout_passes": change >= -DEMO_SE * se}
    return {"sft_heldout": p, "control_last_half": control, "se": se, "heldout_floor": -DEMO_SE * se,
            "games": held["games"], "plays": held["plays"], "algorithms": algorithms,
            "passes": bool(algorithms) and all(a["pool_passes"] and a["heldout_passes"] for a in algorithms.values())}


def demo_verdict(record: dict) -> dict:
    """A set of seeds against the rule: the seeds that pass (>= 4 of 5), and the fresh-clone run's wall time against
    the set's budget (10 minutes; 15 for a changed recipe confirmed at 45-49, the budget then becoming 15 only if the
    recipe passes and needed more than 10). `passes` is None until every seed and the fresh-clone run are in."""
    name, seeds = record["set"], record["seeds"]
    checks = {s: record["runs"][str(s)]["check"] for s in seeds if str(s) in record["runs"]}
    passed = [s for s, c in checks.items() if c["passes"]]
    fresh = record.get("fresh_clone")
    budget = DEMO_BUDGET_S[name]
    wall = fresh["wall_s"] if fresh else None
    complete = len(checks) == len(seeds) and fresh is not None
    seed_rule = len(passed) >= DEMO_PASS_SEEDS if complete else None
    within = wall <= budget if wall is not None else None
    passes = bool(seed_rule and within) if complete else None
    if not complete:
        status = "incomplete"
    elif not seed_rule:
        status = "fails the pass rule"
    else:
        status = "passes" if within else "over budget"
    out = {"complete": complete, "seeds_run": len(checks), "seeds_passed": passed, "needed": DEMO_PASS_SEEDS,
           "of": len(seeds), "seed_rule": seed_rule, "wall_s": wall, "budget_s": budget, "within_budget": within,
           "passes": passes, "status": status}
    if name == "confirmation" and passes:
        out["budget_after_s"] = demo_seeds.BUDGET_S if wall <= demo_seeds.BUDGET_S else budget
    return out


def demo_set(seeds: Sequence[int]) -> str:
    """Which of the protocol's sets `seeds` is: 40-44 (the check) or 45-49 (the confirmation), whole and in order."""
    for name, members in DEMO_SETS.items():
        if tuple(seeds) == members:
            return name
    raise SystemExit(f"study: demo --seeds must be {' '.join(map(str, DEMO_SETS['check']))} or, to confirm a "
                     f"changed recipe, {' '.join(map(str, DEMO_SETS['confirmation']))} (docs/study.md, "
                     f"'The demo at seeds 40–44'); got {' '.join(map(str, seeds))}")


def _git(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=cwd or ROOT, check=False)


def demo_record(data: dict, name: str, seeds: Sequence[int]) -> dict:
    """The set's place in study.json: demo_check itself for 40-44, demo_check.confirmation for 45-49 (made here)."""
    if data.get("demo_check") is None:
        data["demo_check"] = {"set": "check", "seeds": list(DEMO_SETS["check"]), "runs": {}, "fresh_clone": None,
                              "verdict": None}
    record = data["demo_check"] if name == "check" else data["demo_check"].get("confirmation")
    if record is None:
        record = data["demo_check"]["confirmation"] = {"set": name, "seeds": list(seeds), "runs": {},
                                                       "fresh_clone": None, "verdict": None}
    return record


def confirmation_refused(data: dict, head: str) -> str | None:
    """Why 45-49 may not run now: they confirm a changed recipe once, after the recipe failed the pass rule at
    40-44, so 40-44 must be complete and failing at >= 4 of 5 seeds, and the recipe (configs/, seedfast/) must
    differ from the commit 40-44 ran at."""
    check = data.get("demo_check") or {}
    verdict = check.get("verdict") or {}
    if not verdict.get("complete"):
        return "seeds 40-44 are not all in: 45-49 only confirm a recipe changed after 40-44 failed"
    if verdict.get("seed_rule"):
        return ("the recipe passed at 40-44 (" + verdict["status"] + "): 45-49 are kept for a changed recipe, and a "
                "recipe over budget is not rerun")
    first = next(iter(check["runs"].values()))["git_commit"]
    same = _git("diff", "--quiet", first, head, "--", *RECIPE_PATHS)
    if same.returncode == 0:
        return f"configs/ and seedfast/ at HEAD are those of {first[:12]} (40-44's): no changed recipe to confirm"
    if same.returncode != 1:
        return f"git diff {first[:12]} {head[:12]} failed: {same.stderr.strip()}"
    return None


def fresh_clone(dest: Path) -> str:
    """A clone of this tree's HEAD in `dest`: the committed files only, so no runs/ (ignored), no venv and no
    uncommitted change. Returns the commit."""
    head = _git("rev-parse", "HEAD").stdout.strip()
    for args in (("clone", "--quiet", "--no-checkout", str(ROOT), str(dest)),
                 ("-C", str(dest), "checkout", "--quiet", "--detach", head)):
        out = _git(*args)
        if out.returncode != 0:
            raise SystemExit(f"study: git {' '.join(args)} failed: {out.stderr.strip()}")
    if (dest / "runs").exists():
        raise SystemExit(f"study: the clone {dest} has a runs/ folder: not a fresh clone")
    return head


def demo_env(clone: Path) -> dict[str, str]:
    """The demo's environment: this one, with the clone's code first on the path of it and of every process it
    starts (the venv's editable install points at this tree), and the box's default threads (THREAD_VARS left out)."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env["PYTHONPATH"] = str(clone)
    return env


def imports_from(clone: Path, env: dict[str, str]) -> Path:
    """Where this Python, in the clone with the demo's environment, imports seedfast from."""
    out = subprocess.run([sys.executable, "-c", "import seedfast; print(seedfast.__file__)"], cwd=clone, env=env,
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip()).resolve()


def demo(seeds: Sequence[int] = DEMO_SETS["check"], keep: bool = False, under: Path | None = None) -> dict:
    """`python -m experiments.study demo`: `seedfast demo configs/demo_cpu.yaml run.seed=S run.name=demo_cpu_seedS`
    for each seed of the set, one after another (experiments/demo_seeds.run_seed), in a fresh clone of HEAD with this
    venv's Python; each seed's demo_summary.json checked against the rule and recorded (study.json's demo_check, its
    commit and machine with it); the set's first seed, the first run in its clone, makes the games and is the
    fresh-clone run (its wall time, its copy warm-up against demo_fresh_clone.json's). Resumable: a recorded seed is
    skipped; a seed begun and not recorded is made again and a deviation recorded."""
    name = demo_set(seeds)
    head, cpu = _git("rev-parse", "HEAD").stdout.strip(), machine_info().get("cpu")
    with locked() as data:
        record = demo_record(data, name, seeds)
        made = {r["git_commit"] for r in record["runs"].values()}
        if made and made != {head}:
            raise SystemExit(f"study: demo {name}: its seeds ran at {', '.join(sorted(made))}, HEAD is {head}: one "
                             "recipe per set (a changed recipe is confirmed at 45-49)")
        cpus = {r["machine"].get("cpu") for r in record["runs"].values()}
        if cpus and cpus != {cpu}:
            raise SystemExit(f"study: demo {name}: its seeds ran on {cpus}, this CPU is {cpu!r}")
        if name == "confirmation" and not record["runs"]:
            why = confirmation_refused(data, head)
            if why:
                raise SystemExit(f"study: demo 45-49 refused: {why} (docs/study.md, 'The demo at seeds 40–44', "
                                 "the budget)")
        for s in record.get("begun", []):
            if str(s) not in record["runs"]:
                deviation(data, f"demo seed {s} made again from its start", "it was begun and not recorded (a run "
                          "killed or crashed before it finished)")
        record["begun"] = []
        todo = [s for s in seeds if str(s) not in record["runs"]]
    if not todo:
        print(f"demo {name}: every seed recorded, skipped")
        return load()["demo_check"] if name == "check" else load()["demo_check"]["confirmation"]
    if code_changes():
        print(f"demo: this tree changes {', '.join(code_changes()[:5])}; the clone has HEAD ({head[:12]}) without them")
    clone = Path(tempfile.mkdtemp(prefix="seedfast_demo_check_", dir=under))
    fresh_clone(clone)
    env = demo_env(clone)
    where = imports_from(clone, env)
    if clone.resolve() not in where.parents:
        raise SystemExit(f"study: the clone's Python imports seedfast from {where}, not from the clone {clone}")
    print(f"demo {name}: fresh clone of {head[:12]} in {clone}, {sys.executable}")
    for seed in todo:
        with locked() as data:
            demo_record(data, name, seeds)["begun"] = [seed]
        run_dir, wall = demo_seeds.run_seed(CONFIG, seed, [], root=clone, env=env)
        summary = demo_seeds.read_summary(run_dir, wall)
        check = demo_seed_check(summary)
        run = {"seed": seed, "command": f"seedfast demo {CONFIG} run.seed={seed} "
                                      f"run.name={demo_seeds.run_name(CONFIG, seed)}",
               "check": check, "summary": summary, "wall_s": round(wall, 1), "clone": str(clone),
               "python": sys.executable, "first_in_clone": seed == todo[0],
               "threads_env": {k: os.environ.get(k) for k in THREAD_VARS if os.environ.get(k) is not None},
               "git_commit": head, "machine": machine_info()}
        with locked() as data:
            record = demo_record(data, name, seeds)
            record["runs"][str(seed)] = run
            record["begun"] = []
            if seed == seeds[0]:
                record["fresh_clone"] = fresh_clone_record(seed, wall, summary, DEMO_BUDGET_S[name])
            record["verdict"] = demo_verdict(record)
        print(f"demo seed {seed}: " + "; ".join(
            f"{a} pool {v['pool_lead']:+.3f} held-out {v['heldout_change']:+.3f} (floor {check['heldout_floor']:+.3f})"
            for a, v in check["algorithms"].items()) + f": {'passes' if check['passes'] else 'fails'}; {wall:.0f} s")
    if not keep:
        shutil.rmtree(clone, ignore_errors=True)
    result = load()["demo_check"]
    result = result if name == "check" else result["confirmation"]
    print(f"demo {name}: {result['verdict']['status']}")
    return result


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def fresh_clone_record(seed: int, wall: float, summary: dict, budget: float) -> dict:
    """The fresh-clone run: its wall time against the budget, and its copy warm-up (fixed shapes: the box's speed
    at the time) against the one of experiments/results/demo_fresh_clone.json, per step."""
    ref = json.loads(FRESH_REFERENCE.read_text(encoding="utf-8"))
    ref_run = ref["runs"][str(ref["seeds"][0])]
    mine, theirs = summary["sft_phases"], ref_run["sft_phases"]
    per_step = (mine["copy_warmup"] / mine["copy_warmup_steps"]) / (theirs["copy_warmup"] / theirs["copy_warmup_steps"])
    return {"seed": seed, "wall_s": round(wall, 1), "budget_s": budget, "within_budget": wall <= budget,
            "timings": summary["timings"], "copy_warmup_s": mine["copy_warmup"],
            "copy_warmup_steps": mine["copy_warmup_steps"], "speed_vs_reference": per_step,
            "reference": {"file": _relative(FRESH_REFERENCE),
                          "copy_warmup_s": theirs["copy_warmup"], "copy_warmup_steps": theirs["copy_warmup_steps"],
                          "wall_s": ref_run["wall_s"], "git_commit": ref.get("git_commit")}}


# ------------------------------------------------------------------ report


def analysis(data: dict) -> dict:
    """The criterion read from the runs ('The criterion'): per arm the paired differences against GRPO per seed,
    their mean with its 95% t-interval (df 5 at six seeds), the positive seeds, the held-out differences, collapses
    and each clause; primary − shuffled; the answer (None while a seed is missing or the commits differ)."""
    runs, starts, sel = data["runs"], data["starts"], data.get("selection")
    primary = sel["primary"] if sel else None
    commits = sorted({r.get("git_commit") for r in runs.values()})
    out: dict[str, Any] = {"primary": primary, "commits": commits}

    def rec(seed: int, arm: str) -> dict | None:
        return runs.get(f"sparse/s{seed}/{arm}")

    def held(r: dict) -> float | None:
        return (r.get("heldout_after") or {}).get("eval/success_rate")

    complete = True
    for arm in (*FORMS, "shuffled", "self"):
        d, h, pools, collapsed, rules = {}, {}, {}, [], {}
        for s in SEEDS:
            a, g = rec(s, arm), rec(s, "grpo")
            if a is None or g is None:
                complete = False
                continue
            pools[str(s)] = pool_success(a)
            d[str(s)] = pool_success(a) - pool_success(g)
            if held(a) is not None and held(g) is not None:
                h[str(s)] = held(a) - held(g)
            rules[str(s)] = collapse(a, rec(s, "control"), starts.get(f"sparse/s{s}", {}).get("eval/success_rate"))
            if any(rules[str(s)].values()):
                collapsed.append(s)
        stats = interval(list(d.values()))
        positive = sum(v > 0 for v in d.values())
        h_mean = mean(list(h.values()))
        lo = stats["ci95"][0]
        clauses = {"1": bool(d) and stats["mean"] >= MARGIN and lo is not None and lo > 0,
                   "2": positive >= POSITIVE, "4": bool(h) and h_mean >= HELDOUT_FLOOR, "5": not collapsed}
        evidence = {k: mean([mean([v for v in rec(s, arm)["per_update"].get(k, []) if v is not None] or [math.nan])
                             for s in SEEDS if rec(s, arm) is not None]) for k in EVIDENCE}
        out[arm] = {"pool": pools, "d": d, "mean": stats["mean"], "sd": stats["sd"], "ci95": stats["ci95"],
                    "positive": positive, "seeds": len(d), "h": h, "h_mean": h_mean, "collapsed": collapsed,
                    "collapse_rules": rules, "clauses": clauses,
                    "evidence": {k: v for k, v in evidence.items() if not math.isnan(v)}}
    pms = {}
    if primary is not None:
        for s in SEEDS:
            a, b = rec(s, primary), rec(s, "shuffled")
            if a is not None and b is not None:
                pms[str(s)] = pool_success(a) - pool_success(b)
    stats = interval(list(pms.values()))
    out["primary_minus_shuffled"] = {"d": pms, "mean": stats["mean"], "sd": stats["sd"], "ci95": stats["ci95"],
                                     "clause_3": stats["ci95"][0] is not None and stats["ci95"][0] > 0}
    if primary is not None:
        out[primary]["clauses"]["3"] = out["primary_minus_shuffled"]["clause_3"]
    flagged = sorted({s for arm in (*FORMS, "shuffled", "self") for s in out[arm]["collapsed"]})
    out["collapse_baselines"] = {
        str(s): {b: collapse(rec(s, b), rec(s, "control"), starts.get(f"sparse/s{s}", {}).get("eval/success_rate"))
                 for b in ("grpo", "control") if rec(s, b) is not None} for s in flagged}
    out["control"] = {"pool": {str(s): pool_success(rec(s, "control")) for s in SEEDS if rec(s, "control")}}
    out["grpo"] = {"pool": {str(s): pool_success(rec(s, "grpo")) for s in SEEDS if rec(s, "grpo")}}
    out["complete"] = complete and primary is not None
    if len(commits) > 1:
        out["answer"] = None
        out["refused"] = f"the runs were made at {len(commits)} commits: {', '.join(map(str, commits))}"
    elif not out["complete"]:
        out["answer"] = None
    else:
        out["answer"] = "yes" if all(out[primary]["clauses"][c] for c in ("1", "2", "3", "4", "5")) else "no"
    return out


def report() -> dict:
    with locked() as data:
        data["analysis"] = analysis(data)
        result = data["analysis"]
    plot(load())
    for arm in (*FORMS, "shuffled", "self"):
        a = result[arm]
        print(f"{arm:10s} d̄ {_f(a['mean'])} [{_f(a['ci95'][0])}, {_f(a['ci95'][1])}] positive {a['positive']}/"
              f"{a['seeds']} h̄ {_f(a['h_mean'])} collapsed {a['collapsed']} clauses {a['clauses']}")
    print(f"answer: {result['answer']}" + (f" ({result['refused']})" if result.get("refused") else ""))
    return result


def plot(data: dict, path: Path | None = None) -> Path:
    """Left: per arm, the six paired differences labelled by seed, their mean with its 95% t-interval, lines at 0 and
    +0.05. Right: pool success per update, the mean over seeds per arm, with the control."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = data.get("analysis") or analysis(data)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    panels = [(arm, result[arm]) for arm in (*FORMS, "shuffled", "self")]
    panels.append((f"{result['primary']} − shuffled", result["primary_minus_shuffled"]))
    for x, (_, a) in enumerate(panels):
        for s, v in a["d"].items():
            left.plot(x - 0.15, v, "o", color="C0", alpha=0.6)
            left.annotate(s, (x - 0.15, v), xytext=(-10, 0), textcoords="offset points", fontsize=6)
        if a["ci95"][0] is not None:
            left.errorbar(x + 0.1, a["mean"], yerr=[[a["mean"] - a["ci95"][0]], [a["ci95"][1] - a["mean"]]],
                          fmt="s", color="C3", capsize=4)
    left.axhline(0, color="black", linewidth=0.8)
    left.axhline(MARGIN, color="grey", linestyle="--", linewidth=0.8)
    left.set_xticks(range(len(panels)), [p[0] for p in panels], rotation=20, fontsize=8)
    left.set_ylabel("pool success 4-16, paired difference (vs GRPO)")
    left.set_title("per seed (points) and mean with 95% t-interval (df 5)")
    for i, arm in enumerate(("control", "grpo", *FORMS, "shuffled", "self")):
        curves = [data["runs"][f"sparse/s{s}/{arm}"]["per_update"]["train/success_rate"] for s in SEEDS
                  if f"sparse/s{s}/{arm}" in data["runs"]]
        if curves:
            n = min(len(c) for c in curves)
            right.plot(range(1, n + 1), [mean([c[j] for c in curves]) for j in range(n)],
                       color="black" if arm == "control" else f"C{i}", linestyle="--" if arm == "control" else "-",
                       label=f"{arm} ({len(curves)} seeds)")
    right.set_xlabel("update")
    right.set_ylabel("pool success (mean over seeds)")
    right.legend(fontsize=7)
    fig.tight_layout()
    out = path or PLOT
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# ------------------------------------------------------------------ the generated "Result" of docs/study.md


def _signed(x: float | None, digits: int = 3) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.{digits}f}".replace("-", "−")


def _ci(ci: list) -> str:
    return "–" if ci[0] is None else f"[{_signed(ci[0])}, {_signed(ci[1])}]"


def _yes(flag: bool) -> str:
    return "holds" if flag else "fails"


CLAUSES = {"1": "d̄ ≥ +0.05 and the interval's lower end > 0", "2": "d_s > 0 at ≥ 5 of 6 seeds",
           "3": "primary − shuffled: the interval's lower end > 0", "4": "mean h_s ≥ −0.03", "5": "no collapse"}


def lam_key(form: str, lam: float) -> str:
    return f"{form}/{lam:g}"


def gap_row(key: str, g: dict) -> str:
    """One row of the Result's gap table: plain success, mixed groups, each condition's gap with its interval, and the
    CPU it was measured on."""
    plain = g["conditions"]["plain"]
    cells = [key, _f(plain["success"]), _f(plain["mixed_groups"])]
    for c in ("oracle", "own", "shuffled"):
        if c not in g["gaps"]:  # the real model's gap measures plain and oracle only
            cells.append("–")
            continue
        cell = f"{_signed(g['gaps'][c]['mean'])} {_ci(g['gaps'][c]['ci95'])}"
        if c == "own":
            cell += f" ({g['conditions']['own'].get('parse_share', 0):.0%})"
        cells.append(cell)
    cells.append(str((g.get("machine") or {}).get("cpu", "?")).replace("(R)", ""))
    return "| " + " | ".join(cells) + " |"


def deviation_lines(devs: list[dict]) -> list[str]:
    """One line per reason: a reason shared by several deviations (a session's runs on another CPU) lists what each
    one was, with the span of their dates and commits."""
    groups: dict[str, list[dict]] = {}
    for d in devs:
        groups.setdefault(d["why"], []).append(d)
    lines = []
    for why, group in groups.items():
        dates = sorted({d["date"][:10] for d in group})
        commits = sorted({str(d.get("commit"))[:9] for d in group})
        span = f"{dates[0]}" + (f" to {dates[-1]}" if len(dates) > 1 else "") + f", {', '.join(commits)}"
        heads = [d["what"].partition(": ") for d in group]
        if len(group) == 1:
            lines.append(f"- {group[0]['what']}: {why} ({span})")
        elif all(sep and tail == heads[0][2] for _, sep, tail in heads):  # one reason: say it once
            lines.append(f"- {why} ({len(group)}: {', '.join(h for h, _, _ in heads)}, each: {heads[0][2]}; {span})")
        else:
            lines.append(f"- {why} ({len(group)}: {'; '.join(d['what'] for d in group)}; {span})")
    return lines


def seeds_cpus(runs: dict) -> str:
    """', the result's seeds on <cpu> (seeds ...)' per CPU the study's runs were made on."""
    by_cpu: dict[str, set[int]] = {}
    for key, r in runs.items():
        seed = int(key.split("/")[1][1:])
        by_cpu.setdefault(str((r.get("machine") or {}).get("cpu")), set()).add(seed)
    if not by_cpu:
        return ""
    return "; the result's seeds made on " + ", ".join(
        f"{cpu} (seeds {', '.join(map(str, sorted(seeds)))})" for cpu, seeds in sorted(by_cpu.items()))


def collapse_lines(a: dict, gaps: dict, pool_name: str | None) -> list[str]:
    """Per seed where an arm collapsed: which rules fired for which arms, and whether they fire for GRPO and the
    control (no update) at that seed too, so a flag that the start raises is read as the start's."""
    lines = []
    for seed, baselines in (a.get("collapse_baselines") or {}).items():
        arms = [arm for arm in (*FORMS, "shuffled", "self") if int(seed) in a[arm]["collapsed"]]
        rules = sorted({r for arm in arms for r, v in a[arm]["collapse_rules"][seed].items() if v})
        also = {b: [r for r in rules if flags[r]] for b, flags in baselines.items()}
        also = {b: fired for b, fired in also.items() if fired}
        plain = (gaps.get(f"{pool_name}/s{seed}") or {}).get("conditions", {}).get("plain", {})
        named = {"grpo": "GRPO", "control": "the control"}
        text = (f"**Collapse at seed {seed}** (rule {', '.join(rules)}; {', '.join(f'`{x}`' for x in arms)}): "
                + ("at this seed the same rules fire for " + " and ".join(
                    f"{named[b]} (rule {', '.join(fired)})" for b, fired in also.items())
                   + ("; the control makes no update" if "control" in also else "")
                   if also else "neither GRPO nor the control trips them at this seed"))
        if "3" in rules and "invalid_rate" in plain:
            text += ("; the start's own invalid-action share on the pool (the gap's plain plays) is "
                     f"{_f(plain['invalid_rate'])}")
        lines += ["", text + ". Clause 5 is read as the protocol states it, whatever raised the flag."]
    return lines


def gap_reading(a: dict, gaps: dict, pool_name: str | None) -> list[str]:
    """Not pre-registered: the primary's d_s at the seeds where the oracle gap's interval lies above 0 and at the
    others (the literature's claim: distillation helps where the teacher acts better than the student)."""
    primary = a.get("primary")
    if primary is None or not a[primary]["d"]:
        return []
    above, other = [], []
    for s, d in a[primary]["d"].items():
        oracle = (gaps.get(f"{pool_name}/s{s}") or {}).get("gaps", {}).get("oracle")
        if oracle is None:
            continue
        (above if (oracle["ci95"][0] or -1) > 0 else other).append((s, d))

    def part(group: list) -> str:
        return (f"seeds {', '.join(s for s, _ in group)}: d̄ {_signed(mean([d for _, d in group]))} "
                f"({sum(d > 0 for _, d in group)} of {len(group)} positive)" if group else "no seed")

    return ["", f"Not pre-registered, a reading and not the criterion: where the oracle skill's gap lies above 0, "
            f"the primary `{primary}` minus GRPO is {part(above)}; where it does not, {part(other)}."]


def docs_section(data: dict, real: dict | None = None) -> str:
    """The "Result" of docs/study.md, every number read from study.json (and the records of the real model where its
    runs keep them: `real`, from real_model_records): the pool and how it was decided, λ per form and the primary,
    the teacher gap, per seed and per arm the criterion's numbers, each clause's verdict, the real model, the demo
    check and the deviations. The answer comes first, with the count of the deviations and what the data supports
    (experiments/study_reading.py); the deviations' list comes last. Without runs: no result yet."""
    if not data or not (data.get("runs") or data.get("teacher_gap") or data.get("starts") or data.get("demo_check")):
        return wrap_paragraph("No result yet: `experiments/results/study.json` does not exist. `make docs` writes "
                              "this section from it once the runs are in (`python -m experiments.study report` reads "
                              "the criterion).")
    from experiments import study_reading  # it reads this module's statistics and formats

    devs = data.get("deviations") or []
    lines = study_reading.answer_lines(data.get("analysis"), devs) + study_reading.reading_lines(data)
    lines += [f"**Study commit** {str(data.get('study_commit'))[:12]}, its first runs on "
              f"{(data.get('machine') or {}).get('cpu')}" + seeds_cpus(data.get("runs") or {}) + ".", ""]
    pool = data.get("pool")
    gaps = data.get("teacher_gap") or {}
    now = pool_verdict(gaps, pool["name"]) if pool else {}
    lines += [("**The pool:** " + (f"{pool['name']} (`{' '.join(pool['overrides'])}`), decided by the teacher gap"
                                   + (f"; {pool['note']}" if pool.get("note") else "") + ".")
               + (f" On the gaps of the starts in this result, the oracle gap's interval lies above 0 at "
                  f"{now['oracle_above_zero']} of seeds 5–10 (the rule asks {POOL_RULE['oracle_above']}), plain "
                  f"success {_f(now['plain_success'])}, mixed groups {_f(now['mixed_groups'])}: the pool "
                  + ("would pass" if now["passes"] else "would still not pass") + " the rule."
                  if now.get("complete") else "")
               if pool else "**The pool:** not decided yet."), ""]
    if gaps:
        lines += ["| pool/seed | plain success | mixed groups | oracle gap | own gap (parsed) | shuffled gap | CPU |",
                  "|---|---|---|---|---|---|---|"]
        for key in sorted(gaps, key=lambda k: (k.split("/")[0], int(k.split("/s")[1]))):
            lines.append(gap_row(key, gaps[key]))
        lines.append("")
    superseded = [(s["seed"], s["teacher_gap"]) for s in data.get("superseded") or [] if s.get("teacher_gap")]
    if superseded:
        lines += ["Superseded (the gap of a start that went with its session's machine; the seed was made whole "
                  "again from a new start, 'Sessions'):", "",
                  "| pool/seed | plain success | mixed groups | oracle gap | own gap (parsed) | shuffled gap | CPU |",
                  "|---|---|---|---|---|---|---|"]
        lines += [gap_row(f"{data['pool']['name'] if data.get('pool') else '?'}/s{seed} (lost)", g)
                  for seed, g in superseded]
        lines.append("")
    sel = data.get("selection")
    if sel:
        lines += ["**λ per form** (seed 11, pool success over updates 1–8): " + "; ".join(
            f"`{f}` {sel['chosen'][f]:g} ({_f(sel['statistic'][lam_key(f, sel['chosen'][f])])})"
            + (" (every candidate collapsed)" if f in sel.get("all_collapsed", []) else "") for f in FORMS)
            + f". **The primary form: `{sel['primary']}`.**"
            + (f" Collapsed candidates: {', '.join(sel['collapsed'])}." if sel["collapsed"] else ""), ""]
    else:
        lines += ["**λ per form:** not chosen yet.", ""]
    a = data.get("analysis")
    if a and sel:
        arms = (*FORMS, "shuffled", "self")
        head = ["seed", "oracle gap", "control", "GRPO", *arms, f"{a['primary']} − shuffled"]
        pool_name = (data.get("pool") or {}).get("name")
        lines += ["Pool success over updates 4–16 per seed, beside the seed's oracle gap (the teacher's own success "
                  "minus the policy's, above); under each arm its difference from GRPO (d_s) and, after the slash, "
                  "held-out after RL minus GRPO's (h_s):", "",
                  "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for s in map(str, SEEDS):
            oracle = (gaps.get(f"{pool_name}/s{s}") or {}).get("gaps", {}).get("oracle")
            cells = [s, _signed(oracle["mean"]) if oracle else "–", _f(a["control"]["pool"].get(s)),
                     _f(a["grpo"]["pool"].get(s))]
            for arm in arms:
                cells.append(f"{_f(a[arm]['pool'].get(s))} ({_signed(a[arm]['d'].get(s))} / "
                             f"{_signed(a[arm]['h'].get(s))})" + (" collapsed" if int(s) in a[arm]["collapsed"]
                                                                   else ""))
            cells.append(_signed(a["primary_minus_shuffled"]["d"].get(s)))
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "| arm | d̄ | 95% interval | positive seeds | mean h_s | collapsed | clauses |",
                  "|---|---|---|---|---|---|---|"]
        for arm in arms:
            r = a[arm]
            lines.append(f"| `{arm}`{' (primary)' if arm == a['primary'] else ''} | {_signed(r['mean'])} | "
                         f"{_ci(r['ci95'])} | {r['positive']} of {r['seeds']} | {_signed(r['h_mean'])} | "
                         f"{', '.join(map(str, r['collapsed'])) or 'none'} | "
                         + ", ".join(f"{c} {_yes(v)}" for c, v in sorted(r["clauses"].items())) + " |")
        pms = a["primary_minus_shuffled"]
        lines += ["", f"**Primary − shuffled:** {_signed(pms['mean'])} {_ci(pms['ci95'])}.", ""]
        p = a[a["primary"]]
        lines += ["**The criterion, for the primary arm `" + a["primary"] + "`:** " + "; ".join(
            f"({c}) {CLAUSES[c]}: {_yes(p['clauses'][c])}" for c in ("1", "2", "3", "4", "5") if c in p["clauses"])
            + ". " + ({"yes": "**The answer: yes.**", "no": "**The answer: no.**"}.get(
                a.get("answer"), "**No answer yet**" + (f": {a['refused']}." if a.get("refused") else
                                                        ": not every seed's arms are in.")))]
        lines += collapse_lines(a, gaps, pool_name)
        lines += gap_reading(a, gaps, pool_name)
        others = [arm for arm in FORMS if arm != a["primary"] and all(a[arm]["clauses"][c] for c in "1245")]
        if others:
            lines += ["", "Passing clauses 1, 2, 4 and 5 besides the primary (a lead for another study, not this "
                      "study's answer): " + ", ".join(f"`{o}`" for o in others) + "."]
        lines.append("")
    lines += real_model_lines(data, real or {})
    demo = data.get("demo_check")
    lines += demo_lines(demo) if demo else ["**The demo check:** not run yet."]
    if demo and demo.get("confirmation"):
        lines += ["", *demo_lines(demo["confirmation"])]
    lines += ["", "**Deviations** (" + (f"{len(devs)}" if devs else "none") + ")" + (":" if devs else "."), ""]
    lines += deviation_lines(devs)
    return "\n".join(wrap_paragraph(line) if not line.startswith("|") else line for line in lines)


def real_model_records() -> dict:
    """What 'The real model: SmolLM2-135M' wrote where its experiments keep it: {"probe": the teacher probe's record
    or None, "runs": {form: the sparse run's record}} (REAL_MODEL names them)."""
    probe_file, runs_file = RESULTS_DIR / "teacher_probe.json", RESULTS_DIR / "real_model_sparse.json"
    probes = json.loads(probe_file.read_text())["probes"] if probe_file.exists() else {}
    runs = json.loads(runs_file.read_text())["runs"] if runs_file.exists() else {}
    name = REAL_MODEL["teacher_probe"].rsplit("-> ", 1)[1]
    return {"probe": probes.get(name),
            "runs": {f: runs[key] for f, ref in REAL_MODEL["runs"].items() if (key := ref.rsplit("-> ", 1)[1]) in runs}}


def real_model_lines(data: dict, real: dict) -> list[str]:
    """The real model, one seed, read as a description ('The real model: SmolLM2-135M'): the probe's Δ log-prob of
    the walkthrough's actions with the oracle's and the start's own skill, the gap (plain and oracle), and per form
    the pool success over the last half and held-out after RL beside GRPO's and the control's."""
    parts = []
    probe = real.get("probe")
    if probe:
        c = probe["splits"]["train_pool"]["candidates"]
        parts.append("the teacher probe on its SFT start (Δ log-prob of the walkthrough's actions, "
                     f"{probe['splits']['train_pool']['steps']} pool steps): oracle skill "
                     f"{_signed(c['oracle_win']['delta_mean'])} nats ({c['oracle_win']['share_raised']:.0%} of steps "
                     f"raised), its own skill {_signed(c['self_win']['delta_mean'])}")
    gap = (data.get("teacher_gap") or {}).get(REAL_GAP["key"])
    if gap:
        o = gap["gaps"]["oracle"]
        parts.append(f"the teacher gap ({gap['games']} pool games × {gap['plays']} plays, T {gap['temperature']:g}): "
                     f"plain success {_f(gap['conditions']['plain']['success'])}, oracle gap {_signed(o['mean'])} "
                     f"{_ci(o['ci95'])}")
    for form in FORMS:
        record = real.get("runs", {}).get(form)
        if not record:
            continue
        run = next(iter(record["runs"].values()))
        means = run["means"]
        held = {a: v.get("eval/success_rate") for a, v in (run.get("after") or {}).items()}
        text = (f"`{form}` (λ {_setting_of(record, 'loss.opd_coef')}): pool success over the last half SEED "
                f"{_f(means['seed']['last_half'])}")
        baselines = (("grpo", "GRPO"), ("control", "control"))
        text += "".join(f", {name} {_f(means[a]['last_half'])}" for a, name in baselines if a in means)
        text += f"; held-out {_f(run['before']['eval/success_rate'])} → SEED {_f(held.get('seed'))}"
        text += f", GRPO {_f(held['grpo'])}" if held.get("grpo") is not None else ""
        parts.append(text)
    if not parts:
        return ["**The real model** (SmolLM2-135M, seed 1): not run yet.", ""]
    missing = [f"`{f}`" for f in FORMS if f not in real.get("runs", {})] + ([] if probe else ["the probe"]) + (
        [] if gap else ["the gap"])
    return ["**The real model** (SmolLM2-135M, seed 1, a description and not the criterion): " + "; ".join(parts)
            + "." + (f" Not run yet: {', '.join(missing)}." if missing else ""), ""]


def _setting_of(record: dict, name: str) -> str:
    """A dotted override of the run's command line (its record's `overrides`), or '?'."""
    return next((o.split("=", 1)[1] for o in record.get("overrides", []) if o.startswith(f"{name}=")), "?")


def demo_lines(record: dict) -> list[str]:
    """The demo check of one set of seeds: per seed, each algorithm's pool lead over the control and held-out change
    against its floor, and the verdict against the rule (seeds that pass, the fresh-clone run against the budget,
    its copy warm-up against demo_fresh_clone.json's)."""
    seeds, verdict = record["seeds"], record.get("verdict") or demo_verdict(record)
    span = f"{seeds[0]}–{seeds[-1]}"
    what = " (the confirmation of a changed recipe)" if record["set"] == "confirmation" else ""
    runs = [record["runs"][str(s)] for s in seeds if str(s) in record["runs"]]
    if not runs:
        return [f"**The demo check at seeds {span}**{what}: no seed run yet."]
    algorithms = list(runs[0]["check"]["algorithms"])
    lines = [f"**The demo check at seeds {span}**{what}, `seedfast demo {CONFIG}` per seed in a fresh clone at "
             f"{runs[0]['git_commit'][:12]}: each algorithm's pool success over the last half of the updates minus "
             "the control's (passes if > 0), and its held-out success after RL minus the SFT start's (passes if ≥ "
             "−2·SE, SE = √(2p(1 − p)/(games · plays)) at the start's p); ✗ marks a failing number:", ""]
    head = ["seed", "SFT held-out p", "−2·SE", *(f"{a.upper()}: pool / held-out" for a in algorithms), "seed passes",
            "wall time"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        c = run["check"]
        # held-out to 4 digits: a change and its floor can share their first 3 (−0.0859 against −0.0856)
        cells = [str(run["seed"]), _f(c["sft_heldout"]), _signed(c["heldout_floor"], 4)]
        for a in algorithms:
            v = c["algorithms"][a]
            cells.append(f"{_signed(v['pool_lead'])}{'' if v['pool_passes'] else ' ✗'} / "
                         f"{_signed(v['heldout_change'], 4)}{'' if v['heldout_passes'] else ' ✗'}")
        cells += ["yes" if c["passes"] else "no", f"{run['wall_s'] / 60:.1f} min"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    text = (f"{len(verdict['seeds_passed'])} of {verdict['seeds_run']} seeds run pass (the rule: ≥ {verdict['needed']} "
            f"of {verdict['of']}).")
    fresh = record.get("fresh_clone")
    if fresh:
        ref = fresh["reference"]
        text += (f" The fresh-clone run (seed {fresh['seed']}, the games made by it) took {fresh['wall_s'] / 60:.1f} "
                 f"min against the {fresh['budget_s'] / 60:g}-minute budget; its copy warm-up, the box's speed, "
                 f"{fresh['copy_warmup_s']:.0f} s for {fresh['copy_warmup_steps']} steps against "
                 f"{ref['copy_warmup_s']:.0f} s for {ref['copy_warmup_steps']} in `{ref['file']}` "
                 f"({fresh['speed_vs_reference']:.2f}× its time per step).")
    status = verdict["status"]
    if status == "incomplete":
        text += f" **Not complete:** {verdict['seeds_run']} of {verdict['of']} seeds in."
    elif status == "passes":
        text += " **The demo passes the check.**"
        if verdict.get("budget_after_s", demo_seeds.BUDGET_S) > demo_seeds.BUDGET_S:
            text += f" The budget becomes {verdict['budget_after_s'] / 60:g} minutes."
    elif status == "over budget":
        text += " **The demo passes at its seeds but is over budget** (reported with its speed, not rerun)."
    else:
        text += " **The demo fails the pass rule.**"
    lines.append(text)
    return lines


# ------------------------------------------------------------------ command line


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("starts", "gap", "real-gap", "select", "run"):
        p = sub.add_parser(name)
        p.add_argument("--deviation", default=None, help="run although the commit, tree or CPU is not the study's, "
                       "recording WHY as a deviation")
        if name in ("starts", "gap"):
            p.add_argument("--seeds", type=int, nargs="+", default=list(ALL_SEEDS))
        if name == "gap":
            p.add_argument("--pool", choices=sorted(POOLS), default="P1")
        if name == "select":
            p.add_argument("--only", nargs="+", default=None, help="run only these (control, grpo, gate/0.1, ...)")
        if name == "run":
            p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
            p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    sub.add_parser("pool")
    sub.add_parser("report")
    p = sub.add_parser("demo")
    p.add_argument("--seeds", type=int, nargs="+", default=list(DEMO_SETS["check"]),
                   help="40 41 42 43 44, or 45 46 47 48 49 to confirm a changed recipe")
    p.add_argument("--keep", action="store_true", help="keep the clone (a temporary folder) after the runs")
    args = parser.parse_args(argv)
    if args.command == "starts":
        for seed in args.seeds:
            make_start(seed, args.deviation)
    elif args.command == "gap":
        for seed in args.seeds:
            gap(seed, args.pool, args.deviation)
    elif args.command == "real-gap":
        real_gap(args.deviation)
    elif args.command == "pool":
        print(decide_pool())
    elif args.command == "select":
        select(args.only, args.deviation)
    elif args.command == "run":
        run_arms(args.seeds, args.arms, args.deviation)
    elif args.command == "demo":
        demo(args.seeds, args.keep)
    else:
        report()


if __name__ == "__main__":
    main()
