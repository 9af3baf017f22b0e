"""The demo's SFT with glibc's malloc as it comes and with seedfast's settings (app/host_memory.py), side by side.

    python -m benchmarks.host_memory [--config configs/demo_cpu.yaml] [--rounds 1]

Each round runs `seedfast sft`'s main in a fresh process once per setting, alternating which goes first: glibc's
defaults (the process is started without the MALLOC_* variables and never calls keep_freed_memory), then the
settings the CLI applies. Each reports its wall time by phase (the SFT log's data, copy warm-up and training loop),
its minor page faults and its last loss (the settings change where memory comes from, never a number the model
computes). Makes the config's games first if they are missing. Writes results/host_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, write_results
from seedfast.app.host_memory import SETTINGS, keep_freed_memory

MODES = ("glibc_default", "kept")


def child(config: str, mode: str, out_dir: str) -> None:
    """One SFT run in this process; prints its measurements as one JSON line."""
    if mode == "kept":
        assert keep_freed_memory()
    from seedfast.app.demo import sft_events, sft_phases  # after malloc is set: what it imports allocates
    from seedfast.config import load_config
    from seedfast.sft import run as sft

    cfg = load_config(config, [f"run.out_dir={out_dir}", "log.progress=false", "log.tensorboard=false"])
    t = time.perf_counter()
    sft.main(cfg)
    wall = time.perf_counter() - t
    log = Path(out_dir) / cfg.run.name / "sft_metrics.jsonl"
    phases, done = sft_phases(log), sft_events(log)["done"]
    print(json.dumps({"mode": mode, "wall_s": wall, "data_s": phases["data"], "copy_warmup_s": phases["copy_warmup"],
                      "loop_s": phases["steps"], "steps": done["steps"], "last_loss": done["last_loss"],
                      "minor_page_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/demo_cpu.yaml")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.config, args.child, args.out)
        return

    from seedfast.config import load_config
    from seedfast.envs.textworld_games import make_games

    cfg = load_config(args.config)
    e = cfg.env
    make_games(e.games_dir, e.game_type, e.levels, e.n_train, e.n_eval, seed=e.games_seed, workers=e.workers or 2)
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    runs = []
    for round_ in range(args.rounds):
        for mode in (MODES if round_ % 2 == 0 else MODES[::-1]):
            with tempfile.TemporaryDirectory() as out:
                done = subprocess.run([sys.executable, "-m", __spec__.name, "--config", args.config, "--child", mode,
                                       "--out", out], env=env, capture_output=True, text=True, cwd=ROOT)
            if done.returncode:
                raise SystemExit(f"{mode}: exit {done.returncode}\n{done.stderr[-3000:]}")
            runs.append({"round": round_, **json.loads(done.stdout.strip().splitlines()[-1])})
            print(json.dumps(runs[-1]), flush=True)

    def mean(mode: str, key: str) -> float:
        values = [r[key] for r in runs if r["mode"] == mode]
        return sum(values) / len(values)

    keys = ("wall_s", "data_s", "copy_warmup_s", "loop_s", "minor_page_faults")
    means = {mode: {k: mean(mode, k) for k in keys} for mode in MODES}
    speedup = {k: means["glibc_default"][k] / means["kept"][k] for k in keys if means["kept"][k]}
    print(f"{'':>18s} {'glibc default':>14s} {'kept':>14s} {'default / kept':>15s}")
    for k in keys:
        ratio = f"{speedup[k]:15.2f}" if k in speedup else f"{'-':>15s}"
        print(f"{k:>18s} {means['glibc_default'][k]:14.1f} {means['kept'][k]:14.1f} {ratio}")
    same_losses = len({r["last_loss"] for r in runs}) == 1
    print(f"last loss the same in every run: {same_losses}")
    path = write_results("host_memory", {
        "config": args.config, "settings": SETTINGS, "rounds": args.rounds, "runs": runs, "means": means,
        "default_over_kept": speedup, "same_last_loss": same_losses,
        "sft": {"epochs": cfg.sft.epochs, "batch_tokens": cfg.sft.batch_tokens,
                "copy_warmup_steps": cfg.sft.copy_warmup_steps}}, packages=("torch",))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
