"""Teacher probe: does a correct skill, inserted the way the RL teacher inserts it, raise the walkthrough's actions?

    python -m experiments.teacher_probe RUN [--name NAME] [--games 32] [--config CONFIG] [overrides ...]
    python -m experiments.teacher_probe tp_step --name episode_step   # e.g. after `seedfast sft ... run.name=tp_step`

RUN is a run folder with an SFT policy (runs/RUN/sft, from `seedfast sft CONFIG run.name=RUN`; CONFIG is --config,
default configs/demo_cpu.yaml, e.g. configs/smollm2-135m_textworld_cpu.yaml for the real model's start). Every
step of the walkthroughs of `--games` games of the RL pool and of as many held-out games is prompted the agent loop's
way (the walkthrough's own history); its response is the walkthrough's action `<action>CMD</action>` + end of turn.
Each skill-format candidate is put in the teacher context by the RL path itself (train/batch.build_samples: the
config's insertion point, rendering and max_skill_tokens) and scored by the RL scorer (scoring.score, T =
rollout.temperature). Per split and candidate it reports, over steps, the mean Δ = log p(action | skill context) −
log p(action | plain context) (summed over the response tokens), the share of steps Δ > 0, the mean per token (the
RL metric skill/teacher_gap_win's unit), and the length of the skill pieces placed (cut: over max_skill_tokens).
Candidates, each what the teacher takes under skill.skill_mode / skill.teacher_mode (skills/result.teacher_texts):

- `step_plan`:    "Plan: a > b > c", the walkthrough's remaining actions (what SFT's skill copies held before #21);
- `oracle_win`:   what the oracle analyzer writes for the walkthrough (a winner; RL's analyzer=oracle);
- `oracle_fail`:  what the oracle analyzer writes for a failed replay of the same game (what a loser gets);
- `self_win`:     the policy's own greedy analysis of the walkthrough (SEED's analyzer=self), where it parses;
- `oracle_fail_own`: the failed replay's own actions under its own oracle skill (what RL's teacher does to a loser's
                  tokens), by position: before its first deviation from the walkthrough, the mistake, after it.

A check beside it: on the first 16 steps, ℓskill of `step_plan` from the scorer's shared-prefix path equals a plain
forward of the prompt with the skill ids spliced in by hand (splice_max_abs_diff: insertion point, rendering and
position ids). Writes its record (with the machine, versions, commit and command line) into
experiments/results/teacher_probe.json under "probes" → NAME (default: RUN), keeping the other probes: one current
file, its history in git. docs/demo.md quotes the results.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from benchmarks.common import results_record, update_json_atomic
from experiments import RESULTS_DIR
from seedfast.config import load_config
from seedfast.context.segments import insertion_index
from seedfast.context.skill import skill_segment
from seedfast.context.teacher import place_skills
from seedfast.envs.base import normalize_action
from seedfast.rollout.own_engine import Sampler
from seedfast.rollout.prompts import Turn
from seedfast.rollout.records import StepRecord
from seedfast.runtime.setup import load_policy, load_run_tokenizer, load_tasks
from seedfast.scoring import score
from seedfast.sft.examples import action_response_ids, end_of_turn_id, fit_prompt, make_example
from seedfast.sft.loop import pack, token_logprobs
from seedfast.sft.replay import replay_games
from seedfast.sft.run import prompt_style
from seedfast.skills.analyzers import OracleAnalyzer, SelfAnalyzer
from seedfast.skills.result import teacher_texts
from seedfast.train.batch import build_samples
from seedfast.train.draws import task_pool
from seedfast.train.privileged import Privileged

ROOT = Path(__file__).resolve().parents[1]
RESULT = RESULTS_DIR / "teacher_probe.json"  # {"experiment": "teacher_probe", "probes": {NAME: record}}
CANDIDATES = ("step_plan", "oracle_win", "oracle_fail", "self_win")


def step_plan(walkthrough: list[str], step_index: int) -> str:
    """The step skill SFT's skill copies held before they read the analyzers' skill: the remaining actions."""
    return "Plan: " + " > ".join(" ".join(a.split()) for a in walkthrough[step_index:])


def walkthrough_steps(cfg, tokenizer, games):
    """(prompt, response ids, action, step index, skills per candidate) for every walkthrough step of `games`; a
    candidate's skills are (episode text, step text) as the RL teacher takes them under skill.skill_mode."""
    oracle = OracleAnalyzer(cfg.skill.skill_mode)
    steps = []
    for game in games:
        walk = game.success
        written = {"oracle_win": oracle.analyze([walk])[0]}
        if game.failures:
            written["oracle_fail"] = oracle.analyze([game.failures[0]])[0]
        for i, step in enumerate(walk.steps):
            history = [Turn(s.observation, s.action) for s in walk.steps[:i]]
            prompt, _ = fit_prompt(tokenizer, walk.task, history, step.observation, step.admissible_actions, i,
                                   prompt_style(cfg), cfg.rollout.max_prompt_length)
            skills = {"step_plan": (step_plan(walk.actions, i), None)}
            skills.update({k: at_step(r, cfg.skill.skill_mode, i) for k, r in written.items() if r.valid})
            steps.append({"prompt": prompt, "response": action_response_ids(tokenizer, step.action),
                          "action": step.action, "index": i, "game": walk, "skills": skills})
    return steps


def loser_steps(cfg, tokenizer, games):
    """Each game's first failed replay, step by step, scored with its own oracle skill on its own actions: what RL's
    teacher does to a loser's tokens. Steps are labelled by position: before the first deviation from the
    walkthrough, the deviation itself (the mistake), or after it."""
    oracle = OracleAnalyzer(cfg.skill.skill_mode)
    steps = []
    for game in games:
        if not game.failures:
            continue
        fail = game.failures[0]
        result = oracle.analyze([fail])[0]
        if not result.valid:
            continue
        deviation = next((i for i, (a, b) in enumerate(zip(fail.actions, game.success.actions))
                          if normalize_action(a) != normalize_action(b)), len(fail.steps))
        for i, step in enumerate(fail.steps):
            history = [Turn(s.observation, s.action) for s in fail.steps[:i]]
            prompt, _ = fit_prompt(tokenizer, fail.task, history, step.observation, step.admissible_actions, i,
                                   prompt_style(cfg), cfg.rollout.max_prompt_length)
            position = "before" if i < deviation else "mistake" if i == deviation else "after"
            steps.append({"prompt": prompt, "response": action_response_ids(tokenizer, step.action),
                          "action": step.action, "index": i, "game": fail, "position": position,
                          "skills": {"oracle_fail_own": at_step(result, cfg.skill.skill_mode, i)}})
    return steps


def at_step(result, skill_mode: str, index: int) -> tuple[str | None, str | None]:
    episode, step_skills = teacher_texts(result, skill_mode)
    return episode, step_skills.get(index)


def self_skills(cfg, policy, tokenizer, steps) -> float:
    """The policy's greedy analysis of each walkthrough, added to its steps as `self_win`; returns the parse rate."""
    walks = list({id(s["game"]): s["game"] for s in steps}.values())
    analyzer = SelfAnalyzer(Sampler(policy, seed=0), tokenizer, cfg.skill.skill_mode,
                            max_new_tokens=cfg.skill.max_analysis_tokens,
                            max_prompt_tokens=cfg.rollout.max_prompt_length, stop_ids=[end_of_turn_id(tokenizer)])
    results = {id(w): r for w, r in zip(walks, analyzer.analyze(walks))}
    for s in steps:
        r = results[id(s["game"])]
        if r.valid:
            s["skills"]["self_win"] = at_step(r, cfg.skill.skill_mode, s["index"])
    return sum(r.valid for r in results.values()) / max(len(results), 1)


def records_of(steps) -> list[StepRecord]:
    return [StepRecord(segments=s["prompt"].segments, response_ids=tuple(s["response"]), response_logprobs=None,
                       reward=1.0, group_id=0, trajectory_index=row, step_index=s["index"], valid=True, parsed=True,
                       finish_reason="stop") for row, s in enumerate(steps)]


def privileged_of(steps, candidate: str) -> Privileged:
    """Row r's skills as RL's Privileged: the episode text of trajectory r, its step text at the step's index."""
    texts = [s["skills"][candidate] for s in steps]
    return Privileged([e for e, _ in texts], [{s["index"]: t} if t else {} for s, (_, t) in zip(steps, texts)])


def placed_lengths(cfg, tokenizer, prompt, texts: tuple[str | None, str | None]) -> list[int]:
    """Uncut token lengths of the skill pieces RL's teacher places in `prompt` (place_skills, as train/batch)."""
    placed = place_skills(prompt.insert_points(), cfg.skill.insertion, *texts, cfg.skill.teacher_mode)
    return [len(skill_segment(tokenizer, text)) for _, text in placed]


def measure(cfg, policy, tokenizer, steps, candidate: str) -> dict:
    """Δ per step for one candidate, through RL's build_samples and scorer."""
    have = [s for s in steps if candidate in s["skills"]]
    if not have:
        return {"steps": 0}
    samples, counts = build_samples(cfg, records_of(have), privileged_of(have, candidate), tokenizer)
    scores = score(policy, samples, temperature=cfg.rollout.temperature)
    deltas, per_token, kinds = [], [], {}
    for i, s in enumerate(have):
        student, teacher = scores[i].logprob, scores[i].teacher_logprob
        d = float((teacher - student).sum())
        deltas.append(d)
        per_token.append((teacher - student).tolist())
        kinds.setdefault(s.get("position", s["action"].split()[0]), []).append(d)
    pieces = [placed_lengths(cfg, tokenizer, s["prompt"], s["skills"][candidate]) for s in have]
    ids = [sum(p) for p in pieces]
    tokens = [t for row in per_token for t in row]
    return {"steps": len(have), "delta_mean": round(sum(deltas) / len(deltas), 4),
            "share_raised": round(sum(d > 0 for d in deltas) / len(deltas), 3),
            "delta_per_token": round(sum(tokens) / len(tokens), 4),
            "by_action": {k: {"steps": len(v), "delta_mean": round(sum(v) / len(v), 4)}
                          for k, v in sorted(kinds.items())},
            "skill_tokens_mean": round(sum(ids) / len(ids), 1),
            "skill_cut_share": round(sum(max(p) > cfg.skill.max_skill_tokens for p in pieces) / len(pieces), 3),
            "teacher_valid_rate": counts["samples/teacher_valid_rate"],
            "example_skill": have[0]["skills"][candidate]}


def splice_check(cfg, policy, tokenizer, steps, n: int = 16) -> float:
    """max |ℓskill(scorer) − ℓ(plain forward of P[:k] ⊕ S ⊕ P[k:] ⊕ A)| on the first `n` steps."""
    have = steps[:n]
    samples, _ = build_samples(cfg, records_of(have), privileged_of(have, "step_plan"), tokenizer)
    scores = score(policy, samples, temperature=1.0)
    examples = []
    for s in have:
        ids = s["prompt"].ids
        at = insertion_index(s["prompt"].segments, cfg.skill.insertion)
        skill = skill_segment(tokenizer, s["skills"]["step_plan"][0], max_tokens=cfg.skill.max_skill_tokens)
        examples.append(make_example(ids[:at] + skill + ids[at:], s["response"], kind="bc_skill", source="check"))
    with torch.no_grad():
        full = token_logprobs(policy, pack(examples, "cpu"))
    ours = torch.cat([r.teacher_logprob for r in scores])
    return float((ours - full).abs().max())


# the table of skill formats in docs/demo.md: the probe of each format's own SFT, what its copies held (the demo's
# in bold)
READER_FORMATS = (
    ("step_plan_reader", "step plan; analyzers write the episode skill (before)"),
    ("episode_reader", "the episode skill (`skill_mode: episode_only`)"),
    ("numbered_episode",
     "the episode skill, actions numbered as the prompt numbers steps (\"[Step 1] go south [Step 2] …\")"),
    ("episode_step", "the episode skill and a step skill per critical step (`episode_step`, the demo's)"),
)
DEMO_FORMAT = "episode_step"


def reader_table(data: dict) -> str:
    """Δ of the oracle winner's skill on the pool's and the held-out walkthrough steps, and the share of steps it
    raised, per skill format (READER_FORMATS; `make docs` writes it in docs/demo.md)."""
    def signed(x: float) -> str:
        return f"{x:+.2f}".replace("-", "−")

    def percent(share: float) -> int:  # half up: a share of steps is often a count over an even number of steps
        return math.floor(round(100 * share, 6) + 0.5)

    lines = ["| what SFT's skill copies hold, and what the oracle writes | Δ pool | Δ held-out | steps raised |",
             "|---|---|---|---|"]
    for name, label in READER_FORMATS:
        win = [data["probes"][name]["splits"][s]["candidates"]["oracle_win"] for s in ("train_pool", "heldout")]
        cells = [label, signed(win[0]["delta_mean"]), signed(win[1]["delta_mean"]),
                 f"{percent(win[0]['share_raised'])}% / {percent(win[1]['share_raised'])}%"]
        if name == DEMO_FORMAT:
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


DEFAULT_CONFIG = "configs/demo_cpu.yaml"


def probe_config(config: str | Path, run: str, overrides: list[str]):
    """The probe's config: CONFIG (relative to the repository's root unless absolute) with the run's name, in-process
    environments and a 64-game pool (the demo's pool when teacher_probe.json's probes were measured; the demo's is
    smaller since its 10-minute cut), then the command line's overrides."""
    path = Path(config)
    return load_config(path if path.is_absolute() else ROOT / path,
                       [f"run.name={run}", "env.isolation=inline", "rollout.task_pool=64", *overrides])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run")
    parser.add_argument("--name", default=None)
    parser.add_argument("--games", type=int, default=32)
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="the recipe RUN's SFT was made with")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_intermixed_args()
    cfg = probe_config(args.config, args.run, args.overrides)
    t0 = time.perf_counter()
    policy_dir = cfg.run_dir / "sft"
    policy = load_policy(cfg, policy_dir, torch.device("cpu"), trainable=False)
    tokenizer = load_run_tokenizer(cfg, policy_dir)
    pool = task_pool(load_tasks(cfg, "train"), cfg.rollout.task_pool, cfg.run.seed)[: args.games]
    heldout = load_tasks(cfg, "eval")[: args.games]
    out: dict = {"run": args.run, "config": str(args.config), "insertion": cfg.skill.insertion,
                 "skill_mode": cfg.skill.skill_mode, "teacher_mode": cfg.skill.teacher_mode,
                 "max_skill_tokens": cfg.skill.max_skill_tokens, "temperature": cfg.rollout.temperature, "splits": {}}
    for split, tasks in (("train_pool", pool), ("heldout", heldout)):
        replays = replay_games(tasks, seed=cfg.run.seed)
        steps = walkthrough_steps(cfg, tokenizer, replays)
        parse_rate = self_skills(cfg, policy, tokenizer, steps)
        rows = {c: measure(cfg, policy, tokenizer, steps, c) for c in CANDIDATES}
        rows["oracle_fail_own"] = measure(cfg, policy, tokenizer, loser_steps(cfg, tokenizer, replays),
                                          "oracle_fail_own")
        out["splits"][split] = {"games": len(tasks), "steps": len(steps), "self_parse_rate": round(parse_rate, 3),
                                "candidates": rows}
        if split == "train_pool":
            out["splice_max_abs_diff"] = splice_check(cfg, policy, tokenizer, steps)
        for c, r in rows.items():
            if r["steps"]:
                print(f"{split:10s} {c:12s} steps {r['steps']:3d}  Δ/step {r['delta_mean']:+.3f}  raised "
                      f"{r['share_raised']:.2f}  Δ/token {r['delta_per_token']:+.4f}  skill "
                      f"{r['skill_tokens_mean']:.0f} tok (cut {r['skill_cut_share']:.2f})")
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    name = args.name or args.run
    record = results_record("teacher_probe", out, packages=("torch", "tokenizers", "textworld"))
    path = update_json_atomic(RESULT, ["probes", name], record, base={"experiment": "teacher_probe", "probes": {}})
    print(f"splice check max |Δℓ| {out['splice_max_abs_diff']:.2e}; wrote probes → {name} in {path}")


if __name__ == "__main__":
    main()
