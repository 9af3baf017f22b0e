"""The pre-registered SmolLM2-135M study of issue #54: (a) does RL make SmolLM2 better, and (b) only where it does,
does SEED's teacher add to it. The protocol is docs/study_smollm2.md; where it and this script differ, the page wins
and the difference is a bug.

    python -m experiments.smollm2_study --power                      # the protocol's power analysis and budget
    python -m experiments.smollm2_study --part a [--seeds 60 61 62]  # part (a), seed by seed, resumable
            [--land MAIN] [--deviation WHY]                          # records committed on MAIN as they come
    python -m experiments.smollm2_study --part a --collect-only      # the analysis and the plot, from the records
    python -m experiments.smollm2_study --part b                     # refused unless (a) says RL makes it better
    make docs                                                        # docs/study_smollm2.md, from the JSON

One file, experiments/results/smollm2_study.json, rewritten whole and atomically after every job; a job whose record
is in it is skipped, so a killed study goes on where it stopped. Every record carries its commit and machine; the
first run's record fixes `study_commit`, and a run at another commit, from a tree with changes to the code, or on
another kind of CPU is refused unless `--deviation WHY` records it as one (docs/study_smollm2.md, 'One commit, one
file, run by run'). A seed is one bundle: its games, its SFT start and the start's held-out plays, GRPO and its
held-out plays, the no-update control's pool curve, in that order.

Each step is a `seedfast` command in its own process, as a user runs it (`seedfast envs make`, `seedfast sft`,
`seedfast train --resume auto`, `seedfast eval --per-game`), except the control, which has no command:
`Trainer.control_run` here, as the demo runs it (app/demo_jobs.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import git_commit, machine_info, versions, wrap_paragraph, write_json_atomic
from experiments import RESULTS_DIR
from experiments.study import _ci, _f, _signed, code_changes, deviation, interval, mean, t_quantile
from experiments.study_session import weights_sha256

ROOT = Path(__file__).resolve().parents[1]
RESULT = RESULTS_DIR / "smollm2_study.json"
PLOT = RESULTS_DIR / "smollm2_study.png"
PROTOCOL = "docs/study_smollm2.md"
CONFIG = "configs/smollm2-135m_study.yaml"

# ------------------------------------------------------------------ the design (docs/study_smollm2.md)

SEEDS = (60, 61, 62)  # part (a): in no committed result, doc, commit message or run folder before this study
TUNING_SEEDS = (63, 64, 65)  # part (b): the first whose oracle gap's interval lies above 0 chooses SEED's form and λ
GAMES_SEED_PER_SEED = 1000  # env.games_seed = 1000 · run.seed: each seed its own games, none of them played before
THREADS = 2  # torch threads of every step (the update costs of benchmarks/results/real_update.json were measured so)
FIRST_HALF_OFF = 0.5  # the pool clause compares the second half of the updates
Z95 = 1.959963984540054  # the normal's 0.975 quantile
BOOT_DRAWS = 10_000
BOOT_SEED = 54  # the interval's resampling stream, fixed with the protocol

# the power analysis ('The power analysis'): measured inputs, the effects it is read at, its simulation
EFFECTS = (0.03, 0.05, 0.075, 0.1, 0.125, 0.15)
TAUS = (0.0, 0.05)  # the spread of the true effect between seeds
GAMES_CHOICES = (96, 192, 384)
SIM_DRAWS = 4000
SIM_BOOT = 1000
SIM_SEED = 2054
POWER_TARGET = 0.8
B_EFFECT = 0.05  # (b): the SEED − GRPO effect the seeds are counted for
B_AFTER = (0.85, 0.9, 0.95)  # (b): GRPO's held-out success after RL the count is shown at before (a) measures it

# the budget ('Budget and order'): hours of this box's wall time, and the slack a job's estimate is read with
BUDGET_HOURS = 24.0
SLACK = 1.5
B_SELECTION_UPDATES = 32  # (b): the λ-selection runs are a third of a study run
B_CANDIDATES = {"gate": (0.1, 0.3, 1.0), "advantage": (0.3, 1.0, 3.0)}
GAP_GAMES, GAP_PLAYS, GAP_CONDITIONS = 32, 8, 3  # (b): the teacher gap of a start (plain, oracle, own)

PER_UPDATE = ("train/success_rate", "train/groups_with_signal", "rollout/invalid_rate", "train/episode_length",
              "loss/entropy", "loss/ratio_min", "loss/ratio_max", "time/step")
HELDOUT_KEYS = ("eval/success_rate", "eval/episode_length", "eval/invalid_rate", "eval/env_errors")


def design() -> dict[str, Any]:
    """The study's settings as the config resolves them (recorded with the protocol, read by the docs)."""
    from seedfast.config import load_config

    cfg = load_config(ROOT / CONFIG, seed_overrides(SEEDS[0]))
    levels = len(cfg.env.levels)
    return {"config": CONFIG, "seeds": list(SEEDS), "tuning_seeds_b": list(TUNING_SEEDS),
            "updates": cfg.trainer.steps, "games_per_update": cfg.rollout.tasks_per_batch, "plays": cfg.rollout.n,
            "episodes_per_update": cfg.rollout.tasks_per_batch * cfg.rollout.n,
            "optimizer_steps": cfg.trainer.steps * cfg.trainer.ppo_epochs * cfg.trainer.mini_batches,
            "lr": cfg.optim.lr, "lora_rank": cfg.model.lora.rank, "lora_alpha": cfg.model.lora.alpha,
            "task_pool": cfg.rollout.task_pool, "train_games": cfg.env.n_train * levels,
            "heldout_games": cfg.env.n_eval * levels, "heldout_temperature": cfg.rollout.eval_temperature,
            "pool_temperature": cfg.rollout.temperature, "levels": cfg.env.levels, "threads": THREADS}


def seed_overrides(seed: int) -> list[str]:
    """What one seed changes in the config: its seed, its own games (generated from their own seed) and its folder."""
    return [f"run.seed={seed}", f"env.games_seed={GAMES_SEED_PER_SEED * seed}",
            f"env.games_dir=runs/smollm2_study/games_s{seed}", f"run.out_dir=runs/smollm2_study/s{seed}"]


def seeds_in_results(results: Path = RESULTS_DIR) -> set[int]:
    """Every run seed a committed experiment result names (a `seed` key, a `seeds` list, a `run.seed=N` override),
    this study's own file left out: the seeds that are not fresh."""
    found: set[int] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "seed" and isinstance(value, int) and not isinstance(value, bool):
                    found.add(value)
                elif key == "seeds" and isinstance(value, list):
                    found.update(v for v in value if isinstance(v, int) and not isinstance(v, bool))
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str):
            found.update(int(m) for m in re.findall(r"\brun\.seed=(\d+)", node))

    for path in sorted(results.glob("*.json*")):
        if path.name == RESULT.name:
            continue
        text = path.read_text(encoding="utf-8")
        for doc in ([json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl"
                    else [json.loads(text)]):
            walk(doc)
    return found


# ------------------------------------------------------------------ statistics


def paired_differences(after: Sequence[dict], before: Sequence[dict]) -> dict[str, float]:
    """Per held-out game, its success after RL minus its success at the start (each the mean of its plays: one
    greedy play here), from two `seedfast eval --per-game` records. The two must hold the same games."""
    def by_game(plays: Sequence[dict]) -> dict[str, float]:
        wins: dict[str, list[float]] = {}
        for p in plays:
            wins.setdefault(p["game_id"], []).append(float(p["won"]))
        return {g: sum(w) / len(w) for g, w in wins.items()}

    a, b = by_game(after), by_game(before)
    if set(a) != set(b):
        raise ValueError(f"the records hold different games: {sorted(set(a) ^ set(b))[:5]}")
    return {g: a[g] - b[g] for g in sorted(a)}


def seed_summary(diffs: Sequence[float]) -> dict[str, Any]:
    """One seed's paired differences: their mean d_s, the games RL won that the start lost (+), lost that the start
    won (−) and left as they were, and the sample variance (divisor n − 1)."""
    n = len(diffs)
    m = sum(diffs) / n
    return {"games": n, "d": m, "gained": sum(d > 0 for d in diffs), "lost": sum(d < 0 for d in diffs),
            "same": sum(d == 0 for d in diffs),
            "variance": sum((d - m) ** 2 for d in diffs) / (n - 1) if n > 1 else 0.0}


def normal_interval(per_seed: Sequence[Sequence[float]]) -> list[float]:
    """The mean over seeds of the per-seed means, ± 1.96 standard errors from the games' variances within seed:
    Var(d̄) = Σ_s v_s / n_s / k². The bootstrap's check (it is not the criterion)."""
    k = len(per_seed)
    m = sum(sum(v) / len(v) for v in per_seed) / k
    se = math.sqrt(sum(seed_summary(v)["variance"] / len(v) for v in per_seed)) / k
    return [m - Z95 * se, m + Z95 * se]


def bootstrap_interval(per_seed: Sequence[Sequence[float]], draws: int = BOOT_DRAWS, seed: int = BOOT_SEED
                       ) -> list[float]:
    """The criterion's 95% interval of d̄ (the mean over seeds of each seed's mean paired difference): the 2.5% and
    97.5% quantiles of d̄ over `draws` resamples that draw each seed's games with replacement within the seed. A
    resample of n games is drawn as how many of them take each distinct value (a multinomial over the values'
    shares): the same distribution as drawing the games, in a few numbers per seed."""
    rng = np.random.default_rng(seed)
    means = np.zeros(draws)
    for values in per_seed:
        u, counts = np.unique(np.asarray(values, dtype=float), return_counts=True)
        n = len(values)
        means += rng.multinomial(n, counts / n, size=draws) @ u / n
    means /= len(per_seed)
    lo, hi = np.quantile(means, [0.025, 0.975])
    return [float(lo), float(hi)]


def outcome_shares(p_start: float, effect: float, model: str) -> tuple[float, float]:
    """(share of games RL wins that the start loses, share the start wins that RL loses) at a true effect `effect`
    on a start of held-out success `p_start`. "bound": the most games changing hands that the two success rates
    allow (the largest variance of a game's difference, so the least power); "independent": RL's win of a game
    independent of the start's."""
    p_after = p_start + effect
    if not (0.0 <= p_start <= 1.0 and 0.0 <= p_after <= 1.0):
        raise ValueError(f"success rates must lie in [0, 1]: start {p_start}, after {p_after}")
    if model == "bound":
        lost = min(1.0 - p_after, p_start)
    elif model == "independent":
        lost = p_start * (1.0 - p_after)
    else:
        raise ValueError(f"model must be 'bound' or 'independent', got {model!r}")
    return lost + effect, lost


def game_variance(p_start: float, effect: float, model: str) -> float:
    """Var of one game's paired difference D ∈ {−1, 0, +1}: P(D ≠ 0) − E[D]²."""
    gained, lost = outcome_shares(p_start, effect, model)
    return gained + lost - effect ** 2


def interval_power(effect: float, variance: float, games: int, seeds: int, tau: float = 0.0) -> float:
    """The normal approximation of the interval clause's power: d̄ ~ N(effect, (variance/games + tau²)/seeds), and
    the interval, which sees the games' variance only, lies above 0 when d̄ > 1.96·√(variance/(games·seeds))."""
    se_seen = math.sqrt(variance / (games * seeds))
    se_true = math.sqrt((variance / games + tau ** 2) / seeds)
    return 0.5 * math.erfc(-((effect - Z95 * se_seen) / se_true) / math.sqrt(2.0))


def smallest_effect(power_at, target: float = POWER_TARGET, hi: float = 0.2) -> float | None:
    """The smallest effect in [0, hi] at which `power_at(effect)` reaches `target` (bisection; power rises with the
    effect), or None when it does not at hi."""
    if power_at(hi) < target:
        return None
    lo = 0.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if power_at(mid) < target else (lo, mid)
    return hi


def simulated_power(effect: float, p_start: float, model: str, games: int, seeds: int, tau: float = 0.0,
                    draws: int = SIM_DRAWS, boot: int = SIM_BOOT, seed: int = SIM_SEED) -> dict[str, float]:
    """The held-out clauses of the criterion, simulated: `draws` studies of `seeds` seeds × `games` held-out games,
    each seed's true effect effect + tau·z (z standard normal; kept inside what its start allows), its games'
    outcomes drawn with outcome_shares(model), then (1) the bootstrap interval's lower end > 0 (`boot` resamples a
    study) and (2) d_s > 0 at every seed. Returns each clause's share and both together's, and the share in which
    the t-interval over the seeds' d_s (the alternative to clause 1 the protocol sets aside) lies above 0."""
    rng = np.random.default_rng(seed)
    effects = np.clip(effect + tau * rng.standard_normal((draws, seeds)), -p_start, 1.0 - p_start)
    shares = np.array([[outcome_shares(p_start, float(e), model) for e in row] for row in effects])
    probs = np.concatenate([shares, 1.0 - shares.sum(axis=-1, keepdims=True)], axis=-1)  # gained, lost, same
    counts = rng.multinomial(games, probs)  # (draws, seeds, 3)
    d = (counts[..., 0] - counts[..., 1]) / games
    resampled = rng.multinomial(games, np.repeat((counts / games)[:, :, None, :], boot, axis=2))
    dbar = ((resampled[..., 0] - resampled[..., 1]) / games).mean(axis=1)  # (draws, boot)
    lower = np.quantile(dbar, 0.025, axis=1)
    above, positive = lower > 0, (d > 0).all(axis=1)
    half = t_quantile(0.975, seeds - 1) * d.std(axis=1, ddof=1) / math.sqrt(seeds) if seeds > 1 else np.inf
    return {"interval": float(above.mean()), "every_seed": float(positive.mean()),
            "criterion": float((above & positive).mean()), "t_over_seeds": float((d.mean(axis=1) - half > 0).mean())}


# ------------------------------------------------------------------ the protocol's numbers (--power)


def measured_inputs() -> dict[str, Any]:
    """What the power analysis and the budget rest on, read from the committed results: SmolLM2's held-out success
    before and after RL (real_model.json, the recipe of its time), one update's phases (real_update.json) and the
    recipe's other steps (real_model.json's timings)."""
    from seedfast.config import load_config

    real = json.loads((RESULTS_DIR / "real_model.json").read_text())
    summary = real["summary"]
    recipe = load_config(ROOT / real["config"]).env
    made, played = (recipe.n_train + recipe.n_eval) * len(recipe.levels), recipe.n_eval * len(recipe.levels)
    update = json.loads((ROOT / "benchmarks" / "results" / "real_update.json").read_text())
    phases: dict[str, dict[str, float]] = {}
    for row in update["rows"]:
        phases.setdefault(row["variant"], {})[row["phase"]] = row["seconds"]
    runs = list(real["runs"].values())
    return {
        "start_heldout": {**{k: summary["held-out SFT"][k] for k in ("mean", "min", "max")}, "games": played,
                          "source": "experiments/results/real_model.json summary['held-out SFT']"},
        "grpo_after": {"mean": summary["held-out grpo after"]["mean"], "games": played,
                       "source": "experiments/results/real_model.json summary['held-out grpo after']"},
        "update_phases_s": {v: phases[v] for v in ("lora-grpo", "lora-seed")},
        "update_trajectories": update["shapes"]["trajectories"],
        "update_machine": update["machine"]["cpu"], "update_commit": update["git_commit"],
        "update_source": "benchmarks/results/real_update.json rows",
        "sft_s": mean([r["timings"]["sft"] for r in runs]),
        "games_s_per_game": mean([r["timings"]["games"] / made for r in runs]),
        "eval_s_per_game": mean([r["timings"]["eval_sft"] / played for r in runs]),
        "timings_source": "experiments/results/real_model.json runs[*].timings (games, sft, eval_sft)",
    }


def costs(inputs: dict, d: dict) -> dict[str, Any]:
    """Hours of this box's wall time per step at the measured costs, each update's phases scaled from the benchmark's
    trajectories to the study's episodes (conservative: a batch's decode grows less than its size)."""
    scale = d["episodes_per_update"] / inputs["update_trajectories"]
    grpo = sum(inputs["update_phases_s"]["lora-grpo"].values()) * scale
    rollout = inputs["update_phases_s"]["lora-grpo"]["rollout"] * scale
    seed_phases = inputs["update_phases_s"]["lora-seed"]
    own = sum(seed_phases.values()) * scale
    oracle = (sum(seed_phases.values()) - seed_phases["analyze"]) * scale  # the oracle writes without the model
    games = (d["train_games"] + d["heldout_games"]) * inputs["games_s_per_game"]
    evaluation = d["heldout_games"] * inputs["eval_s_per_game"]
    u = d["updates"]
    seed_a = {"its games": games, "the SFT start": inputs["sft_s"],
              "3 held-out evaluations (start, GRPO's own, GRPO's export)": 3 * evaluation,
              f"GRPO, {u} updates": u * grpo, f"the control, {u} updates": u * rollout}
    gap = GAP_GAMES * GAP_PLAYS * GAP_CONDITIONS * rollout / d["episodes_per_update"]
    seed_b = {"the teacher gap": gap, f"oracle SEED, {u} updates": u * oracle + 2 * evaluation,
              f"own-analyzer SEED, {u} updates": u * own + 2 * evaluation,
              f"shuffled-skill SEED, {u} updates": u * oracle + 2 * evaluation}
    candidates = sum(len(v) for v in B_CANDIDATES.values())
    tuning = {"start, its evaluation and gap": games + inputs["sft_s"] + evaluation + gap,
              f"{candidates} candidates × {B_SELECTION_UPDATES} updates": candidates * B_SELECTION_UPDATES * oracle}
    hours = lambda parts: sum(parts.values()) / 3600  # noqa: E731
    return {"seconds_per_update": {"grpo": grpo, "control": rollout, "seed_oracle": oracle, "seed_own": own},
            "seed_a_s": seed_a, "seed_b_s": seed_b, "tuning_b_s": tuning,
            "a_hours": hours(seed_a) * len(SEEDS), "b_hours_per_seed": hours(seed_b), "b_tuning_hours": hours(tuning)}


def power_analysis() -> dict[str, Any]:
    """The protocol's power analysis and budget: the clauses' power at the study's design and its neighbours, from the
    measured start's held-out success, with the variance of a game's difference at its bound."""
    inputs = measured_inputs()
    d = design()
    p_low, p_mean = inputs["start_heldout"]["min"], inputs["start_heldout"]["mean"]
    games, k = d["heldout_games"], len(SEEDS)
    rows = []
    for model, p in (("bound", p_low), ("independent", p_mean)):
        for tau in TAUS:
            for effect in EFFECTS:
                v = game_variance(p, effect, model)
                sim = simulated_power(effect, p, model, games, k, tau)
                rows.append({"model": model, "p_start": p, "tau": tau, "effect": effect, "variance": v,
                             "interval_normal": interval_power(effect, v, games, k, tau), **sim})
    size = {model: simulated_power(0.0, p, model, games, k) for model, p in (("bound", p_low),
                                                                                ("independent", p_mean))}
    smallest = {}
    for n in GAMES_CHOICES:
        smallest[str(n)] = {model: smallest_effect(lambda e, m=model, p=p, n=n: interval_power(
            e, game_variance(p, e, m), n, k)) for model, p in (("bound", p_low), ("independent", p_mean))}
    criterion_smallest = {}
    for model, p in (("bound", p_low), ("independent", p_mean)):
        grid = [round(0.005 * i, 3) for i in range(4, 41)]  # 0.02 to 0.2
        hit = next((e for e in grid if simulated_power(e, p, model, games, k)["criterion"] >= POWER_TARGET), None)
        criterion_smallest[model] = hit
    b_seeds = {}
    for after in B_AFTER:
        v = game_variance(after - B_EFFECT, B_EFFECT, "bound")
        b_seeds[str(after)] = next(s for s in range(3, 100) if interval_power(B_EFFECT, v, games, s) >= POWER_TARGET)
    return {"inputs": inputs, "design": d, "seeds_used_before": sorted(seeds_in_results()), "rows": rows,
            "size": size, "smallest_interval_effect": smallest,
            "smallest_criterion_effect": criterion_smallest, "b_seeds": b_seeds,
            "costs": costs(inputs, d), "budget_hours": BUDGET_HOURS, "slack": SLACK,
            "settings": {"effects": list(EFFECTS), "taus": list(TAUS), "draws": SIM_DRAWS, "boot": SIM_BOOT,
                         "seed": SIM_SEED, "target": POWER_TARGET, "b_effect": B_EFFECT}}


# ------------------------------------------------------------------ the results file


def protocol_commit() -> str | None:
    out = subprocess.run(["git", "log", "-1", "--format=%H", "--", PROTOCOL], capture_output=True, text=True,
                         cwd=ROOT, check=False)
    return out.stdout.strip() or None


def base() -> dict[str, Any]:
    return {"experiment": "smollm2_study", "protocol": {"doc": PROTOCOL}, "study_commit": None, "machine": None,
            "versions": None, "power": None, "runs": {}, "analysis": None, "deviations": []}


def load(result: Path | None = None) -> dict[str, Any]:
    result = result or RESULT
    return json.loads(result.read_text(encoding="utf-8")) if result.exists() else base()


def save(data: dict[str, Any], result: Path | None = None) -> None:
    write_json_atomic(result or RESULT, data)


def check_commit(data: dict, what: str, allow: str | None) -> None:
    """One commit, one kind of CPU: the first run fixes study_commit and the machine; a run at another commit, with
    code changes, or on another CPU is refused, or recorded as a deviation when `allow` says why."""
    commit, changes, cpu = git_commit(), code_changes(), machine_info().get("cpu")
    if data["study_commit"] is None:
        data["study_commit"], data["machine"] = commit, machine_info()
        data["versions"] = versions("torch", "transformers", "seedfast", "textworld")
        data["protocol"]["commit"] = protocol_commit()
    problems = []
    if commit != data["study_commit"]:
        problems.append(f"HEAD is {commit}, the study commit {data['study_commit']}")
    if changes:
        problems.append(f"the tree changes {', '.join(changes[:5])}")
    if data["machine"] and cpu != data["machine"].get("cpu"):
        problems.append(f"the CPU is {cpu!r}, the study's {data['machine'].get('cpu')!r}")
    if problems and allow is None:
        rule = "docs/study_smollm2.md, 'One commit, one file, run by run'"
        raise SystemExit(f"smollm2_study: {what}: {'; '.join(problems)} ({rule}); run from the study's worktree, or "
                         "pass --deviation WHY")
    if problems:
        deviation(data, f"{what}: {'; '.join(problems)}", allow)
    save(data)


def record(data: dict, key: str, value: dict) -> None:
    data["runs"][key] = {**value, "git_commit": git_commit(), "machine": machine_info(),
                         "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    save(data)
    print(f"smollm2_study: recorded {key}", flush=True)


# ------------------------------------------------------------------ part (a), one seed


def run_dir(seed: int, name: str) -> Path:
    return ROOT / "runs" / "smollm2_study" / f"s{seed}" / name


def seedfast(*args: str) -> list[str]:
    return [sys.executable, "-m", "seedfast", *args]


def step(argv: list[str]) -> float:
    """One seedfast command in its own process at the study's threads, this tree's seedfast first on the path (the
    venv's editable install points at the main tree, not at the study's worktree); its wall time."""
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS), "PYTHONPATH": str(ROOT)}
    t = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, check=True, env=env)
    return time.perf_counter() - t


def per_update(metrics: Path) -> dict[str, list]:
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "train/success_rate" in r]
    return {k: [r.get(k) for r in rows] for k in PER_UPDATE if any(k in r for r in rows)}


def held_out(folder: Path, *overrides: str) -> tuple[dict, list[dict], float]:
    """`seedfast eval --per-game` of the run folder's policy (hf/, else its sft/): metrics, plays, wall time."""
    wall = step(seedfast("eval", CONFIG, *overrides, "--per-game"))
    out = json.loads((folder / "eval_eval.json").read_text())
    return {k: out[k] for k in HELDOUT_KEYS if k in out}, out["per_game"], wall


def make_start(data: dict, seed: int, allow: str | None) -> None:
    """Games, the SFT start (full fine-tuning, the recipe's SFT: model.lora.rank=0) and its held-out plays. A start
    made again where its folder went is fingerprinted: other weights than the recorded start's supersede what was
    made from it (its control; GRPO is recorded with its own held-out plays and kept only with its start)."""
    key, folder = f"s{seed}/start", run_dir(seed, "start")
    known = data["runs"].get(key)
    done = all(f"s{seed}/{name}" in data["runs"] for name in ("grpo", "control"))
    if known and (done or (folder / "sft" / "model.safetensors").exists()):
        return
    check_commit(data, f"start s{seed}", allow)
    over = [*seed_overrides(seed), "run.name=start"]
    games_s = step(seedfast("envs", "make", CONFIG, *over))
    if folder.exists():  # an unfinished start: made again whole
        shutil.rmtree(folder)
        if not known:
            deviation(data, f"start s{seed} made again from nothing", "its folder existed without a record")
    sft_s = step(seedfast("sft", CONFIG, *over, "model.lora.rank=0", "sft.max_seconds=null"))
    sha = weights_sha256(folder / "sft")
    if known and known["weights_sha256"] != sha:
        moved = {k: data["runs"].pop(k) for k in (key, f"s{seed}/grpo", f"s{seed}/control") if k in data["runs"]}
        for name in ("grpo", "control"):  # a checkpoint of the old start's run must not be resumed from
            shutil.rmtree(run_dir(seed, name), ignore_errors=True)
        data.setdefault("superseded", []).append({"seed": seed, "records": moved})
        deviation(data, f"seed {seed} made whole again ({', '.join(moved)} superseded)",
                  f"its start's folder went and the start made again has other weights ({known['weights_sha256'][:12]}"
                  f" -> {sha[:12]})")
    elif known:
        return  # the same start: what was made from it stands
    metrics, plays, eval_s = held_out(folder, *over)
    record(data, key, {"policy": str((folder / "sft").relative_to(ROOT)), "weights_sha256": sha,
                       "heldout": metrics, "per_game": plays,
                       "wall_s": {"games": round(games_s, 1), "sft": round(sft_s, 1), "eval": round(eval_s, 1)}})


def run_grpo(data: dict, seed: int, allow: str | None) -> None:
    """GRPO from the start (LoRA, the config's lr), resumed from its newest checkpoint if it was cut, then its
    held-out plays on the exported policy."""
    key, folder = f"s{seed}/grpo", run_dir(seed, "grpo")
    if key in data["runs"]:
        return
    check_commit(data, f"grpo s{seed}", allow)
    over = [*seed_overrides(seed), "run.name=grpo", "algorithm=grpo",
            f"trainer.init_from={run_dir(seed, 'start').relative_to(ROOT)}/sft"]
    resumed = sorted(p.name for p in (folder / "ckpt").glob("step_*")) if (folder / "ckpt").exists() else []
    if resumed:
        deviation(data, f"grpo s{seed} resumed from its checkpoint {resumed[-1]}", "the run was cut (its folder held "
                  "a checkpoint and no record); `seedfast train --resume auto` goes on from it")
        save(data)
    train_s = step(seedfast("train", CONFIG, *over, "--resume", "auto"))
    curves = per_update(folder / "metrics.jsonl")
    last = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()][-1]
    metrics, plays, eval_s = held_out(folder, *over)
    in_loop = {k: last[k] for k in HELDOUT_KEYS if k in last}
    record(data, key, {"per_update": curves, "heldout": metrics, "heldout_in_loop": in_loop, "per_game": plays,
                       "resumed_from": resumed[-1] if resumed else None,
                       "wall_s": {"train": round(train_s, 1), "eval": round(eval_s, 1)}})


def run_control(data: dict, seed: int, allow: str | None) -> None:
    """The no-update control: the start's rollouts on every update's games with GRPO's sampling seeds (the same
    config, LoRA adapters at B = 0 included), no update; its held-out success is the start's."""
    import torch

    from seedfast.config import load_config
    from seedfast.train.rl import Trainer

    key = f"s{seed}/control"
    if key in data["runs"]:
        return
    check_commit(data, f"control s{seed}", allow)
    start = run_dir(seed, "start") / "sft"
    cfg = load_config(ROOT / CONFIG, [*seed_overrides(seed), "run.name=control", "algorithm=grpo",
                                      "loss.kl_coef=0.0", f"trainer.init_from={start}"])
    before = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    t = time.perf_counter()
    trainer = Trainer(cfg, policy_dir=start, run_dir=run_dir(seed, "control"))
    try:
        history = trainer.control_run()
    finally:
        trainer.close()
        torch.set_num_threads(before)
    curves = {k: [r.get(k) for r in history] for k in PER_UPDATE if any(k in r for r in history)}
    record(data, key, {"per_update": curves, "wall_s": {"control": round(time.perf_counter() - t, 1)}})


def run_part_a(seeds: Sequence[int], allow: str | None, land_in: Path | None = None) -> dict:
    import seedfast
    from seedfast.config import load_config

    if not Path(seedfast.__file__).resolve().is_relative_to(ROOT):
        raise SystemExit(f"smollm2_study: seedfast imports from {seedfast.__file__}, not from this tree {ROOT}: run "
                         "`python -m experiments.smollm2_study` from the tree's root")
    model = load_config(ROOT / CONFIG).model.path
    if model and not (ROOT / model / "config.json").is_file():
        raise SystemExit(f"{model} is not there: fetch it first with `.venv/bin/seedfast models fetch smollm2-135m`")
    landed = land_in / RESULT.relative_to(ROOT) if land_in is not None else None
    if landed is not None and landed.resolve() != RESULT.resolve() and landed.exists():
        # the main tree holds every record landed so far, those of a session whose worktree went included
        mine, theirs = load(), load(landed)
        if len(theirs["runs"]) > len(mine["runs"]):
            save(theirs)
    data = load()
    if data.get("power") is None:
        raise SystemExit("smollm2_study: no power analysis in the results file: the protocol's commit holds one")
    for seed in seeds:  # a seed's bundle whole before the next seed's
        for job in (make_start, run_grpo, run_control):
            before = len(data["runs"])
            job(data, seed, allow)
            if land_in is not None and len(data["runs"]) != before:
                land(land_in, f"{job.__name__.removeprefix('run_').removeprefix('make_')} s{seed}")
    return data


def land(main_tree: Path, what: str) -> None:
    """The record just written, on the main tree: the analysis and plot redrawn here, the JSON and plot copied
    there, its doc's generated sections rewritten from them, and those three files committed (a session's machine
    goes back with its worktree; docs/study_smollm2.md, 'One commit, one file, run by run')."""
    collect()
    for path in (RESULT, PLOT):
        if path.exists():
            shutil.copyfile(path, main_tree / path.relative_to(ROOT))
    rewrite = ("from docs import generate; generate.stale(tuple(s for s in generate.SECTIONS "
               f"if s.doc == {PROTOCOL!r}), write=True)")
    subprocess.run([sys.executable, "-c", rewrite], cwd=main_tree, check=True,
                   env={**os.environ, "PYTHONPATH": str(main_tree)})
    files = [str(p.relative_to(ROOT)) for p in (RESULT, PLOT) if p.exists()] + [PROTOCOL]
    subprocess.run(["git", "add", "--", *files], cwd=main_tree, check=True)
    message = f"#54 SmolLM2 study at {str(load()['study_commit'])[:7]}, on {machine_info().get('cpu')}: {what}"
    for _ in range(5):  # another commit on main may hold git's index lock for a moment
        done = subprocess.run(["git", "commit", "-q", "-m", message, "--", *files], cwd=main_tree,
                              capture_output=True, text=True)
        if done.returncode == 0 or "nothing to commit" in done.stdout + done.stderr:
            break
        time.sleep(2)
    print(f"smollm2_study: landed {what} on {main_tree}", flush=True)


# ------------------------------------------------------------------ the analysis of part (a)


def changed(after: Sequence[dict], before: Sequence[dict]) -> int:
    """Held-out games whose greedy play after RL is not the start's (another action somewhere): how far the policy
    moved where it is judged."""
    first_before = {p["game_id"]: p["actions"] for p in reversed(before)}
    first_after = {p["game_id"]: p["actions"] for p in reversed(after)}
    return sum(first_after[g] != first_before[g] for g in first_before)


def ratio_range(curves: dict[str, list]) -> list[float | None]:
    """The lowest and highest probability ratio of the sampled tokens over the run's updates (None: not logged)."""
    low = [v for v in curves.get("loss/ratio_min", []) if v is not None]
    high = [v for v in curves.get("loss/ratio_max", []) if v is not None]
    return [min(low) if low else None, max(high) if high else None]


def pool_lead(grpo: dict, control: dict) -> float:
    """GRPO's pool success minus the control's, each the mean over the second half of the updates (the same games
    and sampling seeds, so paired update by update)."""
    g, c = grpo["per_update"]["train/success_rate"], control["per_update"]["train/success_rate"]
    n = min(len(g), len(c))
    first = int(n * FIRST_HALF_OFF)
    return mean(g[first:n]) - mean(c[first:n])


def analyze(data: dict, seeds: Sequence[int] | None = None) -> dict[str, Any]:
    """Part (a)'s criterion on the records: per seed d_s (paired per game), its gains and losses, the pool lead,
    the games whose play changed; over seeds d̄, its bootstrap interval (the criterion's), the normal interval and
    the t-interval over seeds (reported, not clauses), each clause and the answer."""
    runs, seeds = data["runs"], SEEDS if seeds is None else seeds
    per_seed, diffs = {}, []
    for s in seeds:
        start, grpo, control = (runs.get(f"s{s}/{name}") for name in ("start", "grpo", "control"))
        if not (start and grpo):
            continue
        d = paired_differences(grpo["per_game"], start["per_game"])
        row = {**seed_summary(list(d.values())), "start": start["heldout"]["eval/success_rate"],
               "after": grpo["heldout"]["eval/success_rate"],
               "in_loop_agrees": grpo["heldout_in_loop"].get("eval/success_rate") ==
               grpo["heldout"]["eval/success_rate"],
               "changed": changed(grpo["per_game"], start["per_game"]),
               "ratio_range": ratio_range(grpo["per_update"]),
               "cpu": grpo["machine"].get("cpu"), "commit": grpo["git_commit"]}
        if control:
            row["pool_lead"] = pool_lead(grpo, control)
            row["first_update_equal"] = (grpo["per_update"]["train/success_rate"][0] ==
                                         control["per_update"]["train/success_rate"][0])
        per_seed[str(s)] = row
        diffs.append(list(d.values()))
    out: dict[str, Any] = {"seeds": per_seed, "complete": len(per_seed) == len(seeds) and all(
        "pool_lead" in r for r in per_seed.values())}
    if not diffs:
        return out
    dbar = mean([r["d"] for r in per_seed.values()])
    commits = {r["commit"] for r in per_seed.values()}
    out.update({"d": dbar, "ci95": bootstrap_interval(diffs), "normal_ci95": normal_interval(diffs),
                "t_over_seeds": interval([r["d"] for r in per_seed.values()]),
                "pool_lead": mean([r["pool_lead"] for r in per_seed.values() if "pool_lead" in r]),
                "commits": sorted(c for c in commits if c)})
    if not out["complete"]:
        return out
    clauses = {"interval": out["ci95"][0] > 0, "every_seed": all(r["d"] > 0 for r in per_seed.values()),
               "pool": out["pool_lead"] > 0}
    out["clauses"] = clauses
    if len(commits) > 1:
        out["answer"], out["refused"] = None, f"the runs are at {len(commits)} commits"
    elif all(clauses.values()):
        out["answer"] = "better"
    elif out["ci95"][1] < 0:
        out["answer"] = "worse"
    else:
        out["answer"] = "not shown"
    return out


def collect(result: Path | None = None) -> dict:
    """The analysis written into the results file, and the plot redrawn."""
    result = result or RESULT
    data = load(result)
    data["analysis"] = analyze(data)
    save(data, result)
    if data["analysis"]["seeds"]:
        plot(data, result.with_suffix(".png"))
    return data


# ------------------------------------------------------------------ the plot


def plot(data: dict, path: Path | None = None) -> Path:
    """Per seed, a column: the pool curves (GRPO and the control, success per update at the pool's temperature)
    above, the held-out games paired below (won by both, by GRPO only, by the start only, by neither)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = list(data["analysis"]["seeds"])
    fig, axes = plt.subplots(2, len(seeds), figsize=(4.6 * len(seeds), 7), squeeze=False)
    for col, s in enumerate(seeds):
        top, bottom = axes[0][col], axes[1][col]
        for name, style in (("grpo", {"color": "#2a9d8f"}), ("control", {"color": "grey", "linestyle": "--"})):
            rec = data["runs"].get(f"s{s}/{name}")
            if rec:
                curve = rec["per_update"]["train/success_rate"]
                top.plot(range(1, len(curve) + 1), curve, alpha=0.35, **style)
                w = 8
                smooth = [mean(curve[max(0, i - w + 1):i + 1]) for i in range(len(curve))]
                top.plot(range(1, len(curve) + 1), smooth, label=f"{name} (mean of the last {w})", **style)
        top.set_title(f"seed {s}: pool success per update")
        top.set_xlabel("RL update")
        top.set_ylim(-0.02, 1.02)
        top.legend(fontsize=8)
        start, grpo = data["runs"][f"s{s}/start"], data["runs"].get(f"s{s}/grpo")
        if grpo:
            won_before = {p["game_id"]: p["won"] for p in start["per_game"]}
            won_after = {p["game_id"]: p["won"] for p in grpo["per_game"]}
            both = sum(won_before[g] and won_after[g] for g in won_before)
            gained = sum(won_after[g] and not won_before[g] for g in won_before)
            lost = sum(won_before[g] and not won_after[g] for g in won_before)
            neither = len(won_before) - both - gained - lost
            names = ["both", "GRPO only", "start only", "neither"]
            bottom.bar(names, [both, gained, lost, neither], color=["#999999", "#2a9d8f", "#e76f51", "#dddddd"])
            row = data["analysis"]["seeds"][s]
            bottom.set_title(f"held-out games: start {row['start']:.3f} → GRPO {row['after']:.3f} "
                             f"(d {row['d']:+.3f})", fontsize=9)
        bottom.set_ylabel("held-out games (greedy)")
    fig.tight_layout()
    path = path or PLOT
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------ docs/study_smollm2.md's generated sections


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def power_section(data: dict) -> str:
    """'The power analysis' and 'Budget and order': the power of the criterion's clauses at the measured inputs, the
    smallest effects found 80% of the time, the seeds (b) needs, and the hours of each part."""
    p = data.get("power")
    if not p:
        return "No power analysis yet: `python -m experiments.smollm2_study --power`."
    i, d, c = p["inputs"], p["design"], p["costs"]
    s = i["start_heldout"]
    lines = [
        "Run seeds the committed results name (`seeds_in_results`, at the protocol's commit): "
        + ", ".join(map(str, p["seeds_used_before"])) + f". The study's: {', '.join(map(str, d['seeds']))}; "
        f"(b)'s tuning seeds {', '.join(map(str, d['tuning_seeds_b']))}.", "",
        f"Inputs: SmolLM2's SFT start on the recipe's 24 held-out games (levels 1–4) won {_f(s['min'])} and "
        f"{_f(s['max'])} at seeds 0 and 1 (mean {_f(s['mean'])}; `{s['source']}`); GRPO after 8 updates at lr 1e-5 "
        f"won {_f(p['inputs']['grpo_after']['mean'])} (`{i['grpo_after']['source']}`), a change of "
        f"{_signed(i['grpo_after']['mean'] - s['mean'])}. A game's paired difference D = won after − won at the start "
        "is −1, 0 or +1; its variance P(D ≠ 0) − δ² is largest when as many games change hands as the two success "
        "rates allow (`bound`, at the lower start, " + _f(s["min"]) + "), and `independent` assumes RL's win of a "
        f"game independent of the start's (at the mean start). Design: {len(d['seeds'])} seeds × "
        f"{d['heldout_games']} held-out games; simulated with {p['settings']['draws']} studies of "
        f"{p['settings']['boot']} bootstrap resamples each (seed {p['settings']['seed']}).", "",
        "| variance model | τ (between seeds) | δ | Var(D) | interval clause (normal) | interval clause | "
        "every seed | the criterion | t over seeds (set aside) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in p["rows"]:
        lines.append(f"| {r['model']} | {r['tau']:g} | {_signed(r['effect'])} | {_f(r['variance'])} | "
                     f"{_pct(r['interval_normal'])} | {_pct(r['interval'])} | {_pct(r['every_seed'])} | "
                     f"**{_pct(r['criterion'])}** | {_pct(r['t_over_seeds'])} |")
    size = p["size"]
    sm = p["smallest_interval_effect"]
    lines += [
        "", f"With no effect (δ = 0) the criterion says \"better\" in {_pct(size['bound']['criterion'])} "
        f"(`bound`) and {_pct(size['independent']['criterion'])} (`independent`) of the simulated studies (the "
        f"interval clause alone: {_pct(size['bound']['interval'])} and {_pct(size['independent']['interval'])}).", "",
        f"**The smallest effect found {p['settings']['target']:.0%} of the time** by the whole criterion (τ = 0): "
        f"{_signed(p['smallest_criterion_effect']['bound'])} (`bound`), "
        f"{_signed(p['smallest_criterion_effect']['independent'])} (`independent`). By the interval clause alone "
        "(normal approximation, τ = 0), per number of held-out games a seed: "
        + "; ".join(f"{n} games {_signed(v['bound'])} (`bound`), {_signed(v['independent'])} (`independent`)"
                    for n, v in sm.items()) + ".", "",
        f"**Part (b)'s seeds:** the SEED − GRPO difference at δ = {_signed(p['settings']['b_effect'])} is found 80% "
        f"of the time (interval clause, `bound`, {d['heldout_games']} games a seed) with "
        + ", ".join(f"{k} seeds at GRPO's held-out success after RL {a}" for a, k in p["b_seeds"].items())
        + " (both arms after RL, near the ceiling: the fewer games change hands, the fewer seeds).", ""]
    spu = c["seconds_per_update"]
    lines += [
        f"Costs, from `{i['update_source']}` (one update's phases, {i['update_trajectories']} trajectories, "
        f"{i['update_machine']}, 2 threads, at {i['update_commit'][:7]}), scaled to {d['episodes_per_update']} "
        f"episodes, and `{i['timings_source']}`: seconds per update GRPO {spu['grpo']:.0f}, control "
        f"{spu['control']:.0f}, oracle SEED {spu['seed_oracle']:.0f}, own-analyzer SEED {spu['seed_own']:.0f}; "
        f"SFT {i['sft_s']:.0f} s; {i['games_s_per_game']:.2f} s a game made; {i['eval_s_per_game']:.2f} s a "
        "held-out game played.", "",
        "| part | step | hours |", "|---|---|---|"]
    lines += [f"| (a), a seed | {k} | {_h(v)} |" for k, v in c["seed_a_s"].items()]
    lines += [f"| (a) | **{len(d['seeds'])} seeds** | **{c['a_hours']:.1f}** (× {p['slack']:g} for the box's "
              f"load: {c['a_hours'] * p['slack']:.1f}) |"]
    lines += [f"| (b), the tuning seed | {k} | {_h(v)} |" for k, v in c["tuning_b_s"].items()]
    lines += [f"| (b), a seed of (a) | {k} | {_h(v)} |" for k, v in c["seed_b_s"].items()]
    b3 = c["b_tuning_hours"] + 3 * c["b_hours_per_seed"]
    a_slack, b_slack = c["a_hours"] * p["slack"], b3 * p["slack"]
    left = p["budget_hours"] - a_slack
    lines += [f"| (b) | **tuning + 3 seeds** | **{b3:.1f}** (× {p['slack']:g}: {b_slack:.1f}) |", "",
              f"**The budget:** {p['budget_hours']:g} hours of this box's wall time for the study. (a) needs "
              f"{a_slack:.1f} with the slack; the {left:.1f} left are {'enough' if b_slack <= left else 'not enough'}"
              f" for (b) at its fewest seeds and its tuning seed ({b_slack:.1f})."]
    return "\n".join(wrap_paragraph(line) if not line.startswith("|") else line for line in lines)


ANSWERS = {"better": "**The answer: yes, RL makes SmolLM2-135M better** on held-out games at these starts.",
           "worse": "**The answer: RL makes SmolLM2-135M worse** on held-out games at these starts (the interval "
                    "lies below 0).",
           "not shown": "**The answer: not shown.** RL did not make SmolLM2-135M better by this criterion."}


def docs_section(data: dict) -> str:
    """docs/study_smollm2.md's "Result": the answer first, then per seed and over seeds what it rests on, the
    deviations last."""
    a = data.get("analysis") or {}
    seeds = a.get("seeds") or {}
    if not seeds:
        return ("No run yet: the runs are made from a worktree at this protocol's commit (\"One commit, one file, "
                "run by run\").")
    lines = []
    answer = a.get("answer")
    if answer:
        lines.append(ANSWERS[answer] + f" d̄ = {_signed(a['d'])}, 95% interval {_ci(a['ci95'])} (games resampled "
                     f"within seed); {sum(r['d'] > 0 for r in seeds.values())} of {len(seeds)} seeds above 0; GRPO's "
                     f"pool success over the second half {_signed(a['pool_lead'])} against the control's.")
        if answer == "not shown":
            lines[-1] += f" The interval leaves effects up to {_signed(a['ci95'][1])} possible."
            if all(r["changed"] == 0 for r in seeds.values()):
                lines[-1] += " No held-out game's greedy play changed: RL did not move the policy where it is judged."
    else:
        lines.append("**No answer yet**" + (f": {a['refused']}." if a.get("refused") else
                                            f": {len(seeds)} of {len(SEEDS)} seeds in."))
    lines += ["", "| seed | CPU | start held-out | GRPO held-out | d_s | games gained / lost | greedy play changed "
              "| ratio range | pool lead | in-loop eval agrees |", "|---|---|---|---|---|---|---|---|---|---|"]
    for s, r in seeds.items():
        lines.append(f"| {s} | {r['cpu']} | {_f(r['start'])} | {_f(r['after'])} | {_signed(r['d'])} | "
                     f"{r['gained']} / {r['lost']} | {r['changed']} of {r['games']} | "
                     f"{_f(r['ratio_range'][0], 2)}–{_f(r['ratio_range'][1], 2)} | {_signed(r.get('pool_lead'))} | "
                     f"{'yes' if r['in_loop_agrees'] else 'no'} |")
    if "d" in a:
        t = a["t_over_seeds"]
        lines += ["", f"Over seeds: d̄ {_signed(a['d'])}, bootstrap {_ci(a['ci95'])} (the criterion), normal "
                  f"{_ci(a['normal_ci95'])}"
                  + (f", t over seeds {_ci(t['ci95'])} (df {t['df']}; reported, not a clause)." if t["df"] else ".")
                  + (" Clauses: " + ", ".join(f"{k} {'holds' if v else 'fails'}" for k, v in a["clauses"].items())
                     + "." if a.get("clauses") else "")]
    lines += ["", f"The curves: `experiments/results/{PLOT.name}`.", ""]
    devs = data.get("deviations") or []
    lines += [f"**Deviations** ({len(devs) or 'none'})" + (":" if devs else "."), ""]
    lines += [f"- {d['what']}: {d['why']} ({d['date'][:10]}, {str(d['commit'])[:7]})" for d in devs]
    return "\n".join(wrap_paragraph(line) if not line.startswith("|") else line for line in lines)


# ------------------------------------------------------------------ command line


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--power", action="store_true", help="the protocol's power analysis and budget, into the JSON")
    parser.add_argument("--part", choices=("a", "b"), default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--collect-only", action="store_true", help="no run: the analysis and the plot")
    parser.add_argument("--deviation", default=None, help="run although the commit, tree or CPU is not the "
                        "study's, recording WHY as a deviation")
    parser.add_argument("--land", type=Path, default=None, metavar="MAIN",
                        help="after every record, copy the JSON and plot into the main tree MAIN, rewrite its doc's "
                        "generated sections and commit those files there")
    args = parser.parse_args(argv)
    if args.power:
        data = load()
        data["power"] = power_analysis()
        save(data)
        print(f"smollm2_study: the power analysis is in {RESULT}")
        return
    if args.part == "b":
        a = load().get("analysis") or {}
        if a.get("answer") != "better":
            raise SystemExit("smollm2_study: part (b) runs only where (a) says RL makes SmolLM2 better "
                             f"(its answer: {a.get('answer') or 'none yet'}); docs/study_smollm2.md, 'Part (b)'")
        raise SystemExit("smollm2_study: part (b)'s runs are built and committed before its first run, as "
                         "docs/study_smollm2.md, 'Part (b)' fixes them, and only with the budget it names")
    if args.part != "a":
        parser.error("give --power or --part a")
    if not args.collect_only:
        unknown = [s for s in args.seeds if s not in SEEDS]
        if unknown:
            raise SystemExit(f"smollm2_study: seeds {unknown} are not part (a)'s {SEEDS}")
        run_part_a(args.seeds, args.deviation, args.land)
    data = collect()
    print(json.dumps({k: v for k, v in data["analysis"].items() if k != "seeds"}, indent=1, default=str))


if __name__ == "__main__":
    main()
