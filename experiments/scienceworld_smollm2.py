"""SmolLM2-135M on the ScienceWorld CPU recipe, measured (issue #55, point 6): its SFT start on the held-out test
variations beside the random floor, its teacher gap with oracle skills, and one GRPO run against the no-update
control, pool and held-out.

    python -m experiments.scienceworld_smollm2                   # every stage not yet recorded, in order
    python -m experiments.scienceworld_smollm2 --stage probe     # one stage (start, probe, timing, grpo, control)
    python -m experiments.scienceworld_smollm2 --stage report    # the analysis again, from the records

On configs/smollm2-135m_scienceworld.yaml, run folders under runs/scienceworld_smollm2/ (its gold cache in games/),
one seed (run.seed 0, the recipe's). Each stage is recorded in results/scienceworld_smollm2.json as it ends (with its
commit, machine and wall time) and skipped when its record is there, so a killed run goes on where it stopped:

- `start`: `seedfast sft` (the recipe's behaviour-cloning SFT on the train variations' gold sequences, its whole
  epoch: sft.max_seconds=null), then `seedfast eval --split test --per-game`: one greedy play of each of the 18 test
  variations, the random floor's (results/scienceworld_floor.json).
- `probe`: the teacher gap of experiments/teacher_probe.py (Δ = log p(action | skill context) − log p(action | plain
  context), summed over the response tokens, scored by RL's scorer through RL's build_samples at the pool's
  temperature) on every gold step of the RL pool (rollout.task_pool train variations), with the oracle analyzer's
  skill of the winning replay (`oracle_win`, what RL's teacher reads with analyzer=oracle), and teacher_probe's
  splice check. Only train variations carry a gold sequence: dev and test have none (runtime/setup.py
  scienceworld_tasks), so there is no held-out gap.
- `timing`: the GRPO run's first update (`seedfast train` with trainer.steps=1), its seconds; the run gets
  GRPO_BUDGET_S of updates at that pace (updates_for), unless --updates says otherwise.
- `grpo`: the same run resumed from that update's checkpoint to its update count (`seedfast train --resume auto`;
  trainer.steps is the one setting that changes, and the constant schedule does not read it): algorithm=grpo, LoRA
  r16 α32 at the lr probe's 3e-5, from the start's sft/; then `seedfast eval --split test --per-game` of its export.
  Its in-loop evaluation after the last update plays 2 dev games only (trainer.eval_games=2, the run's train
  commands alone): dev is not compared here, and 18 would cost a quarter of an hour.
- `control`: the no-update control as smollm2_study.py makes it (Trainer.control_run: the start's rollouts of every
  update, the same games and sampling seeds, LoRA adapters at B = 0, no update). Its held-out policy is the start,
  so its test plays are the start's.

The analysis (`analysis`): the start's test success and mean final score beside the floor's; the GRPO − control
held-out difference paired per test variation (success and final score) with the bootstrap 95% interval of its mean
(smollm2_study.bootstrap_interval: variations resampled with replacement, 10,000 draws, seed 54); pool success per
update of both arms and their means. docs/environments.md, 'SmolLM2 on ScienceWorld: measured', quotes it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import git_commit, machine_info, write_results
from experiments import RESULTS_DIR
from experiments.smollm2_study import BOOT_DRAWS, BOOT_SEED, bootstrap_interval, seed_summary
from experiments.study import code_changes

ROOT = Path(__file__).resolve().parents[1]
NAME = "scienceworld_smollm2"
RESULT = RESULTS_DIR / f"{NAME}.json"
FLOOR = RESULTS_DIR / "scienceworld_floor.json"
CONFIG = "configs/smollm2-135m_scienceworld.yaml"
OUT = f"runs/{NAME}"
THREADS = 2  # torch threads of every step, as the SmolLM2 study's
STAGES = ("start", "probe", "timing", "grpo", "control")
# the GRPO run's update count: as many updates as fit this many seconds at the timing stage's pace (the run's model
# load, final dev evaluation and export come on top), so that the run takes about an hour of this loaded 2-core box
GRPO_BUDGET_S = 3000.0
PROBE_CANDIDATES = ("oracle_win",)  # teacher_probe's other candidates cost as much each: not asked here
IN_LOOP_EVAL = "trainer.eval_games=2"  # the train commands' final dev evaluation, cut (not compared)
MIN_UPDATES = 4
# RL's update: LoRA at rank 16 (alpha 32) and the lr the TextWorld lr probe chose for it
# (configs/smollm2-135m_textworld_cpu_lora.yaml, experiments/results/lr_probe.json)
LORA = ("model.lora.rank=16", "model.lora.alpha=32", "optim.lr=3e-5")
PER_UPDATE = ("train/success_rate", "train/groups_with_signal", "rollout/invalid_rate", "train/episode_length",
              "loss/entropy", "loss/ratio_min", "loss/ratio_max", "time/step")
HELDOUT_KEYS = ("eval/success_rate", "eval/episode_length", "eval/invalid_rate", "eval/env_errors")
LOST_SCORE = -100  # ScienceWorld's score once the task was made impossible


# ------------------------------------------------------------------ the settings of each stage


def common(name: str) -> list[str]:
    return [f"run.out_dir={OUT}", f"env.games_dir={OUT}/games", f"run.name={name}", "log.progress=false"]


def start_overrides() -> list[str]:
    return common("start")


def rl_overrides(name: str, updates: int) -> list[str]:
    """GRPO's run (and the control's, and the timing's): from the start's SFT policy, LoRA, `updates` updates."""
    return [*common(name), "algorithm=grpo", "loss.kl_coef=0.0", f"trainer.init_from={OUT}/start/sft", *LORA,
            f"trainer.steps={updates}"]


def updates_for(seconds_per_update: float, budget_s: float = GRPO_BUDGET_S, least: int = MIN_UPDATES) -> int:
    """The updates that fit `budget_s` at `seconds_per_update`, rounded down to an even count (the pool's halves
    are compared), at least `least`."""
    n = int(budget_s // seconds_per_update)
    return max(least, n - n % 2)


# ------------------------------------------------------------------ the analysis (tests/experiments/)


def task_of(game_id: str) -> str:
    """A ScienceWorld game id's task type: 'find-non-living-thing/225[easy]' -> 'find-non-living-thing'."""
    return game_id.split("/")[0]


def end_of(play: dict) -> str:
    """How a play ended: won, error (the environment failed it), lost (score -100: the task made impossible), or at
    the step limit."""
    if play["won"]:
        return "won"
    if "error" in play:
        return "error"
    return "lost" if play.get("score") == LOST_SCORE else "steps"


def heldout_summary(plays: Sequence[dict]) -> dict[str, Any]:
    """`seedfast eval --per-game` plays: games, wins, success, mean final score (over plays with a score), how they
    ended, and the same per task type."""
    def of(group: Sequence[dict]) -> dict[str, Any]:
        scores = [p["score"] for p in group if p.get("score") is not None]
        return {"games": len(group), "wins": sum(p["won"] for p in group),
                "success": sum(p["won"] for p in group) / len(group),
                "mean_score": statistics.mean(scores) if scores else None, "scored": len(scores),
                "ends": dict(sorted(Counter(end_of(p) for p in group).items()))}

    tasks = sorted({task_of(p["game_id"]) for p in plays})
    return {**of(plays), "per_task": {t: of([p for p in plays if task_of(p["game_id"]) == t]) for t in tasks}}


TWINS = ("lifespan-longest-lived", "lifespan-shortest-lived")  # the same variations, the same animals, opposite goals


def first_focus(actions: Sequence[str]) -> str | None:
    return next((a for a in actions if a.startswith("focus on")), None)


def twins(plays: Sequence[dict], a: str = TWINS[0], b: str = TWINS[1]) -> dict[str, int]:
    """Does the policy read which of two twin tasks it plays? Over the variations both tasks hold (the same world, the
    opposite goal): how many pairs it answered with the same first `focus on` (so at most one of the two can win),
    and how many pairs it won once or twice."""
    def by_variation(task: str) -> dict[str, dict]:
        return {p["game_id"].split("/", 1)[1]: p for p in plays if task_of(p["game_id"]) == task}

    x, y = by_variation(a), by_variation(b)
    both = sorted(set(x) & set(y))
    same = [v for v in both if first_focus(x[v]["actions"]) is not None
            and first_focus(x[v]["actions"]) == first_focus(y[v]["actions"])]
    return {"pairs": len(both), "same_first_focus": len(same),
            "won_one": sum(x[v]["won"] + y[v]["won"] == 1 for v in both),
            "won_both": sum(x[v]["won"] and y[v]["won"] for v in both)}


def paired(after: Sequence[dict], before: Sequence[dict], key: str) -> dict[str, float]:
    """Per game (one play each), `key` after minus before ('won' counts 1/0); games where either play has no value
    (a score the environment's failure left None) are left out. The two records must hold the same games once."""
    a, b = ({p["game_id"]: p for p in plays} for plays in (after, before))
    if set(a) != set(b) or len(a) != len(after) or len(b) != len(before):
        raise ValueError(f"the records hold different games, or a game twice: {sorted(set(a) ^ set(b))[:5]}")
    out = {}
    for g in sorted(a):
        x, y = a[g].get(key), b[g].get(key)
        if x is not None and y is not None:
            out[g] = float(x) - float(y)
    return out


def paired_summary(after: Sequence[dict], before: Sequence[dict], key: str, draws: int = BOOT_DRAWS,
                   seed: int = BOOT_SEED) -> dict[str, Any]:
    """The mean paired difference of `key` (after − before), the games up, down and the same, and the bootstrap 95%
    interval of the mean (games resampled with replacement: smollm2_study.bootstrap_interval with one seed)."""
    diffs = paired(after, before, key)
    values = list(diffs.values())
    s = seed_summary(values)
    return {"games": s["games"], "mean": s["d"], "up": s["gained"], "down": s["lost"], "same": s["same"],
            "ci95_bootstrap": bootstrap_interval([values], draws=draws, seed=seed), "per_game": diffs}


def halves(values: Sequence[float]) -> dict[str, float]:
    """Mean over all updates, the first half and the second half (the second the longer when the count is odd)."""
    h = len(values) // 2
    return {"all": statistics.mean(values), "first_half": statistics.mean(values[:h]) if h else None,
            "second_half": statistics.mean(values[h:])}


def pool_summary(grpo: Sequence[float], control: Sequence[float], episodes_per_update: int) -> dict[str, Any]:
    """Pool success per update of the two arms (the same games and sampling seeds each update): their means, wins,
    GRPO − control per update, and whether the first update (the same policy in both arms) played alike."""
    if len(grpo) != len(control):
        raise ValueError(f"GRPO has {len(grpo)} updates, the control {len(control)}")
    lead = [g - c for g, c in zip(grpo, control)]
    return {"updates": len(grpo), "episodes_per_update": episodes_per_update,
            "grpo": halves(grpo), "control": halves(control), "grpo_minus_control": halves(lead),
            "wins": {"grpo": round(sum(grpo) * episodes_per_update),
                     "control": round(sum(control) * episodes_per_update)},
            "episodes": len(grpo) * episodes_per_update, "first_update_equal": grpo[0] == control[0]}


def analysis(stages: dict[str, dict], floor: dict | None) -> dict[str, Any]:
    """What the docs quote, from the stage records present (a stage not run yet is left out)."""
    out: dict[str, Any] = {}
    start = stages.get("start")
    if start:
        out["start"] = heldout_summary(start["per_game"])
        out["start_twins"] = twins(start["per_game"])
        if floor:
            out["floor"] = {k: floor["summary"][k] for k in ("episodes", "wins", "success", "mean_score")}
            out["floor"]["seeds"] = len(floor["seeds"])
    probe = stages.get("probe")
    if probe:
        out["teacher_gap"] = {c: {k: r[k] for k in ("steps", "delta_mean", "share_raised", "delta_per_token")}
                              for c, r in probe["candidates"].items() if r.get("steps")}
    grpo, control = stages.get("grpo"), stages.get("control")
    if grpo and start:
        out["heldout"] = {"grpo": heldout_summary(grpo["per_game"]), "control": out["start"],
                          "grpo_twins": twins(grpo["per_game"]),
                          "success": paired_summary(grpo["per_game"], start["per_game"], "won"),
                          "score": paired_summary(grpo["per_game"], start["per_game"], "score")}
    if grpo and control:
        out["pool"] = pool_summary(grpo["per_update"]["train/success_rate"],
                                   control["per_update"]["train/success_rate"], grpo["episodes_per_update"])
    return out


# ------------------------------------------------------------------ the results file


def load() -> dict[str, Any]:
    return json.loads(RESULT.read_text(encoding="utf-8")) if RESULT.exists() else {}


def design(updates: int | None) -> dict[str, Any]:
    from seedfast.config import load_config

    cfg = load_config(ROOT / CONFIG, rl_overrides("grpo", updates or 1))
    return {"config": CONFIG, "seed": cfg.run.seed, "tasks": cfg.env.scienceworld.tasks,
            "simplifications": cfg.env.scienceworld.simplifications, "max_steps": cfg.env.max_steps,
            "train_variations": cfg.env.n_train * len(cfg.env.scienceworld.tasks), "task_pool": cfg.rollout.task_pool,
            "test_variations": cfg.env.n_eval * len(cfg.env.scienceworld.tasks),
            "tasks_per_batch": cfg.rollout.tasks_per_batch, "plays": cfg.rollout.n,
            "episodes_per_update": cfg.rollout.tasks_per_batch * cfg.rollout.n, "updates": updates,
            "optimizer_steps": updates * cfg.trainer.ppo_epochs * cfg.trainer.mini_batches if updates else None,
            "rl_lr": cfg.optim.lr, "lora_rank": cfg.model.lora.rank, "lora_alpha": cfg.model.lora.alpha,
            "pool_temperature": cfg.rollout.temperature, "heldout_temperature": cfg.rollout.eval_temperature,
            "threads": THREADS, "grpo_budget_s": GRPO_BUDGET_S,
            "overrides": {"start": start_overrides() + ["sft.max_seconds=null"],
                          "grpo": [*rl_overrides("grpo", updates), IN_LOOP_EVAL] if updates else None,
                          "grpo_test_eval": rl_overrides("grpo", updates) if updates else None,
                          "control": rl_overrides("control", updates) if updates else None}}


def save(data: dict[str, Any]) -> Path:
    stages = data.get("stages", {})
    updates = stages.get("timing", {}).get("updates")
    floor = json.loads(FLOOR.read_text(encoding="utf-8")) if FLOOR.exists() else None
    payload = {"experiment": NAME, "design": design(updates), "stages": stages, "analysis": analysis(stages, floor),
               "notes": data.get("notes", [])}
    return write_results(NAME, payload, packages=("torch", "transformers", "scienceworld", "seedfast"),
                         directory=RESULTS_DIR)


def record(data: dict, stage: str, value: dict) -> None:
    """A stage's record, with the commit and the code files the tree changed from it when the stage began (others
    edit this tree: a stage reads what is there), its machine and date."""
    data.setdefault("stages", {})[stage] = {
        **value, "git_commit": data.get("commit_at_start") or git_commit(),
        "tree_changes_at_start": data.get("tree_changes_at_start"),
        "machine": machine_info(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    save(data)
    print(f"{NAME}: recorded {stage}", flush=True)


# ------------------------------------------------------------------ the stages


def seedfast(*args: str) -> float:
    """One seedfast command in its own process at THREADS threads, this tree's seedfast; its wall time."""
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS), "MKL_NUM_THREADS": str(THREADS), "PYTHONPATH": str(ROOT)}
    t = time.perf_counter()
    print(f"{NAME}: seedfast {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, "-m", "seedfast", *args], cwd=ROOT, check=True, env=env)
    return time.perf_counter() - t


def test_eval(overrides: list[str], folder: Path) -> tuple[dict, list[dict], float]:
    """`seedfast eval --split test --per-game` of the run folder's policy: metrics, plays, wall time."""
    wall = seedfast("eval", CONFIG, *overrides, "--split", "test", "--per-game")
    out = json.loads((folder / "eval_test.json").read_text())
    metrics = {k: v for k, v in out.items() if k != "per_game"}
    return metrics, out["per_game"], wall


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def stage_start(data: dict) -> None:
    folder = ROOT / OUT / "start"
    sft_s = None
    if not (folder / "sft" / "model.safetensors").exists():
        sft_s = round(seedfast("sft", CONFIG, *start_overrides(), "sft.max_seconds=null"), 1)
    metrics, plays, eval_s = test_eval(start_overrides(), folder)
    rows = jsonl(folder / "sft_metrics.jsonl")
    record(data, "start", {"policy": f"{OUT}/start/sft", "sft_first": rows[0], "sft_last": rows[-1],
                           "heldout": metrics, "per_game": plays,
                           "wall_s": {"sft": sft_s, "eval": round(eval_s, 1)}})


def stage_probe(data: dict) -> None:
    """The teacher gap with oracle skills on the RL pool's gold steps (experiments/teacher_probe.py's measure)."""
    import torch

    from experiments import teacher_probe as tp
    from seedfast.config import load_config
    from seedfast.runtime.setup import load_policy, load_run_tokenizer, load_tasks, scienceworld_factory
    from seedfast.sft.replay import replay_games
    from seedfast.train.draws import task_pool

    t0 = time.perf_counter()
    torch.set_num_threads(THREADS)
    cfg = load_config(ROOT / CONFIG, [*start_overrides(), "env.isolation=inline"])
    policy_dir = ROOT / OUT / "start" / "sft"
    policy = load_policy(cfg, policy_dir, torch.device("cpu"), trainable=False)
    tokenizer = load_run_tokenizer(cfg, policy_dir)
    pool = task_pool(load_tasks(cfg, "train"), cfg.rollout.task_pool, cfg.run.seed)
    gold_held_out = {split: sum(t.walkthrough is not None for t in load_tasks(cfg, split))
                     for split in ("eval", "test")}
    make_env = scienceworld_factory(cfg, step_limit=max(len(t.walkthrough) for t in pool) + 1)
    replays = replay_games(pool, seed=cfg.run.seed, make_env=make_env)  # as `seedfast sft` replays them
    for game in replays:  # the analyzers' world (sft/run.py walkthrough_replays)
        for trajectory in (game.success, *game.failures):
            trajectory.meta["world"] = cfg.env.kind
    steps = tp.walkthrough_steps(cfg, tokenizer, replays)
    rows = {c: tp.measure(cfg, policy, tokenizer, steps, c) for c in PROBE_CANDIDATES}
    splice = tp.splice_check(cfg, policy, tokenizer, steps)
    for c, r in rows.items():
        if r["steps"]:
            print(f"{c:16s} steps {r['steps']:3d}  Δ/step {r['delta_mean']:+.3f}  raised {r['share_raised']:.2f}  "
                  f"Δ/token {r['delta_per_token']:+.4f}", flush=True)
    record(data, "probe", {"split": "train_pool", "games": [t.game_id for t in pool], "steps": len(steps),
                           "failed_replays": sum(len(g.failures) for g in replays),
                           "heldout_tasks_with_gold": gold_held_out, "insertion": cfg.skill.insertion,
                           "skill_mode": cfg.skill.skill_mode, "teacher_mode": cfg.skill.teacher_mode,
                           "temperature": cfg.rollout.temperature, "candidates": rows,
                           "splice_max_abs_diff": splice, "wall_s": round(time.perf_counter() - t0, 1)})


def stage_timing(data: dict, updates: int | None) -> None:
    """The GRPO run's first update, and the run's update count from its seconds."""
    folder = ROOT / OUT / "grpo"
    wall = seedfast("train", CONFIG, *rl_overrides("grpo", 1), IN_LOOP_EVAL, "--resume", "auto")
    row = next(r for r in jsonl(folder / "metrics.jsonl") if r.get("step") == 0 and "time/step" in r)
    chosen = updates_for(row["time/step"])
    record(data, "timing", {"seconds_per_update": row["time/step"], "wall_s": round(wall, 1),
                            "updates_at_budget": chosen, "updates": updates or chosen,
                            "updates_from": "--updates" if updates else "updates_for(seconds_per_update)"})


def per_update(rows: Sequence[dict]) -> dict[str, list]:
    rows = [r for r in rows if "train/success_rate" in r]
    return {k: [r.get(k) for r in rows] for k in PER_UPDATE if any(k in r for r in rows)}


def env_failures(rows: Sequence[dict], prefix: str) -> dict[str, float]:
    """The environments' counters summed over the updates (worker restarts, failed simulator steps by kind, ...)."""
    out: Counter = Counter()
    for r in rows:
        out.update({k: v for k, v in r.items() if k.startswith(prefix) and isinstance(v, (int, float))})
    return dict(sorted(out.items()))


def stage_grpo(data: dict) -> None:
    from seedfast.config import load_config
    from seedfast.runtime.setup import load_tasks
    from seedfast.train.draws import choose_tasks, task_pool

    updates = data["stages"]["timing"]["updates"]
    folder = ROOT / OUT / "grpo"
    over = rl_overrides("grpo", updates)
    resumed = sorted(p.name for p in (folder / "ckpt").glob("step_*")) if (folder / "ckpt").exists() else []
    train_s = seedfast("train", CONFIG, *over, IN_LOOP_EVAL, "--resume", "auto")
    rows = [r for r in jsonl(folder / "metrics.jsonl") if "train/success_rate" in r]  # the updates' rows
    last = [r for r in rows if "eval/success_rate" in r][-1]  # the final update's dev evaluation
    metrics, plays, eval_s = test_eval(over, folder)
    cfg = load_config(ROOT / CONFIG, over)
    pool = task_pool(load_tasks(cfg, "train"), cfg.rollout.task_pool, cfg.run.seed)
    games = [[t.game_id for t in choose_tasks(pool, cfg.rollout.tasks_per_batch, cfg.run.seed, s)]
             for s in range(updates)]
    record(data, "grpo", {"updates": updates, "episodes_per_update": cfg.rollout.tasks_per_batch * cfg.rollout.n,
                          "per_update": per_update(rows), "games_per_update": games,
                          "env_failures": env_failures(rows, "rollout/env_"),
                          "dev_in_loop_2_games": {k: last[k] for k in HELDOUT_KEYS if k in last},
                          "heldout": metrics, "per_game": plays, "resumed_from": resumed[-1] if resumed else None,
                          "wall_s": {"train_after_timing": round(train_s, 1), "eval": round(eval_s, 1)}})


def stage_control(data: dict) -> None:
    """Trainer.control_run, as experiments/smollm2_study.py runs it; the games each update played are recorded
    from its rollouts (and must be GRPO's), and the environments' counters with them."""
    import torch

    from seedfast.config import load_config
    from seedfast.envs.slots import counter_delta, counters_of
    from seedfast.train.rl import Trainer

    updates = data["stages"]["timing"]["updates"]
    start = ROOT / OUT / "start" / "sft"
    cfg = load_config(ROOT / CONFIG, rl_overrides("control", updates))
    before = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    t = time.perf_counter()
    trainer = Trainer(cfg, policy_dir=start, run_dir=ROOT / OUT / "control")
    games: list[list[str]] = []
    failures: list[dict[str, float]] = []
    rollout = trainer.rollout

    def watched(step: int, timer: Any) -> Any:  # the control's rollouts, watched, not changed
        counters = counters_of(trainer.envs)
        result = rollout(step, timer)
        games.append(sorted({tr.game_id for tr in result.trajectories}))
        failures.append({"rollout/env_errors": float(result.stats.env_errors),
                         **counter_delta(counters, counters_of(trainer.envs), "rollout/env_")})
        return result

    trainer.rollout = watched
    try:
        history = trainer.control_run()
    finally:
        trainer.close()
        torch.set_num_threads(before)
    grpo_games = data["stages"].get("grpo", {}).get("games_per_update")
    record(data, "control", {"updates": updates, "per_update": per_update(history), "games_per_update": games,
                             "same_games_as_grpo": [sorted(g) for g in grpo_games] == games if grpo_games else None,
                             "env_failures": env_failures(failures, "rollout/env_"),
                             "wall_s": {"control": round(time.perf_counter() - t, 1)}})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stage", choices=(*STAGES, "report"), default=None, help="run this stage only (again)")
    p.add_argument("--updates", type=int, default=None, help="the GRPO run's updates (default: the timing's choice)")
    p.add_argument("--note", default=None, help="append a note to the results file (what happened to a run: a pause, "
                   "a resume), with the date")
    args = p.parse_args()
    model = ROOT / ".cache/models/smollm2-135m-instruct"
    if not (model / "config.json").is_file():
        sys.exit(f"{model} is not there: fetch it first with `.venv/bin/seedfast models fetch smollm2-135m`")
    data = load()
    data.setdefault("stages", {})
    if args.note:
        data.setdefault("notes", []).append(
            {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "note": args.note})
        if not args.stage:
            save(data)
            return
    todo = [args.stage] if args.stage else [s for s in STAGES if s not in data["stages"]]
    for stage in todo:
        data["commit_at_start"], data["tree_changes_at_start"] = git_commit(), code_changes()
        if stage == "report":
            save(data)
        elif stage == "timing":
            stage_timing(data, args.updates)
        else:
            globals()[f"stage_{stage}"](data)
    print(json.dumps(load().get("analysis", {}), indent=1, default=str)[:4000])


if __name__ == "__main__":
    main()
