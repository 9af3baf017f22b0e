"""RL step time by phase: SEED vs GRPO (and SDAR) on the same batch (target, docs/performance.md: SEED ≤ 1.10× GRPO).

One rollout is made once and handed to every algorithm, each starting from the same weights, so the
comparison isolates what each algorithm adds after the rollout: analysis (SEED: the policy writes a skill per
trajectory), the teacher branch in scoring (shared-prefix), and the OPD term in the update.
Ratios are reported two ways: the whole step (rollout included), and the learner part alone.

    python -m benchmarks.step            # tiny CPU model on real TextWorld games; table + results/step.json
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchmarks.common import machine_info, median, print_table, write_results
from seedfast.config import load_config
from seedfast.envs.textworld_games import make_games
from seedfast.model import save_hf
from seedfast.runtime.profiling import PhaseTimer
from seedfast.sft.tiny_model import build_tiny
from seedfast.train.draws import seed_everything
from seedfast.train.rl import Trainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--max-steps", type=int, default=4)
    ap.add_argument("--analysis-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--games-dir", default=str(Path(tempfile.gettempdir()) / "seedfast_bench_games"))
    args = ap.parse_args()

    games = make_games(args.games_dir, "treasure_hunter", [3, 4], args.tasks, 1, seed=0, workers=2)
    work = Path(tempfile.mkdtemp(prefix="seedfast_step_bench_"))
    base = [
        f"env.games_dir={args.games_dir}", "env.levels=[3, 4]", f"env.n_train={args.tasks}", "env.n_eval=1",
        f"env.max_steps={args.max_steps}", "env.isolation=inline", "env.history_k=2", f"run.out_dir={work}",
        "model.dtype=fp32", "model.attn_backend=sdpa", f"model.tiny.hidden={args.hidden}",
        f"model.tiny.layers={args.layers}", "model.tiny.heads=4", "model.tiny.kv_heads=2",
        f"model.tiny.intermediate={3 * args.hidden}", "model.tiny.max_seq_len=4096",
        f"rollout.n={args.n}", f"rollout.tasks_per_batch={args.tasks}", "rollout.max_response_tokens=24",
        "rollout.max_prompt_length=1024", f"skill.max_analysis_tokens={args.analysis_tokens}",
        "trainer.device=cpu", "trainer.eval_every=0", "log.tensorboard=false", "log.progress=false",
        "loss.kl_coef=0.0",
    ]
    cfg = load_config(None, base)
    texts = [r.objective + " " + " ".join(r.walkthrough or []) for r in games] * 20
    model, tokenizer = build_tiny(cfg, texts)
    policy = work / "policy"
    save_hf(model, policy)
    tokenizer.save_pretrained(str(policy))

    variants = {"grpo": ["algorithm=grpo"], "seed (self analyzer)": ["algorithm=seed", "skill.analyzer=self"],
                "seed (oracle skills)": ["algorithm=seed", "skill.analyzer=oracle", "skill.teacher_params=old"],
                # the teacher scored by the parameters being trained, in every optimizer step (docs/algorithms.md,
                # 'Which parameters score the teacher'): its cost beside the θ_old teacher's, on the same batch
                "seed (oracle, current teacher)": ["algorithm=seed", "skill.analyzer=oracle",
                                                   "skill.teacher_params=current"],
                "sdar": ["algorithm=sdar", "skill.analyzer=oracle"]}
    phases: dict[str, dict[str, list[float]]] = {name: {} for name in variants}
    for rep in range(args.reps):
        seed_everything(rep)
        roller = Trainer(load_config(None, [*base, "algorithm=grpo", "run.name=roll"]), policy_dir=policy)
        rollout_timer = PhaseTimer()
        result = roller.rollout(rep, rollout_timer)
        roller.close()
        for name, extra in variants.items():
            trainer = Trainer(load_config(None, [*base, *extra, f"run.name={name.split()[0]}"]), policy_dir=policy)
            timer = PhaseTimer()
            seed_everything(rep)
            trainer.learn(rep, result, timer)
            trainer.close()
            seconds = {"rollout": rollout_timer.seconds["rollout"], **timer.seconds}
            for k, v in seconds.items():
                phases[name].setdefault(k, []).append(v)

    names = ["rollout", "analyze", "score", "advantage", "update"]
    rows, totals = [], {}
    for name, per in phases.items():
        med = {k: median(v) for k, v in per.items()}
        learn = sum(med.get(k, 0.0) for k in names[1:])
        totals[name] = (learn + med["rollout"], learn)
        rows.append({"algorithm": name, **{k: round(med.get(k, 0.0), 3) for k in names},
                     "learner_s": round(learn, 3), "step_s": round(learn + med["rollout"], 3)})
    grpo_total, grpo_learn = totals["grpo"]
    for row in rows:  # ratios of the unrounded seconds
        total, learn = totals[row["algorithm"]]
        row["step_vs_grpo"] = round(total / grpo_total, 3)
        row["learner_vs_grpo"] = round(learn / grpo_learn, 3)
    print_table(rows, ["algorithm", *names, "learner_s", "step_s", "step_vs_grpo", "learner_vs_grpo"],
                title=f"RL step by phase (s, median of {args.reps}), same rollout for all")
    write_results("step", {
        "machine": machine_info(),
        "shapes": {"tasks": args.tasks, "n": args.n, "hidden": args.hidden, "layers": args.layers,
                   "max_steps": args.max_steps, "analysis_tokens": args.analysis_tokens,
                   "step_samples": len(result.steps)},
        "rows": rows,
        "target": "SEED step <= 1.10x GRPO step (docs/performance.md, 'Targets')",
    })


if __name__ == "__main__":
    main()
