"""The largest learning rate whose probability ratios stay inside PPO's clip range, read from ratios, not success
(issue #53, 'The step size'): full fine-tuning and LoRA on the SmolLM2 recipe.

    python -m experiments.lr_probe                         # SFT start (made once), probe, results/lr_probe.json
    python -m experiments.lr_probe --batches 2 --full-lrs 1e-6 3e-6 --lora-lrs 1e-5 3e-5 [overrides]

The rule, fixed before the probe ran:
    For each lr of a grid, each of `--batches` rollouts of the recipe's SFT start is learned from once, by the
    recipe's own update (trainer.mini_batches=2, one epoch): the first mini-batch's optimizer step moves θ, the
    second mini-batch is then scored under the moved θ against its ℓold (θ_old's scoring pass). Its response
    tokens' ratios exp(ℓθ − ℓold) are read from the update's own fused loss. A lr passes when, in every batch, at
    least 99% of those tokens lie inside [1 − loss.clip_low, 1 + loss.clip_high]; the recipe takes the largest lr
    of the grid that passes (the grid is ascending; a pass above a failure is reported but not taken).
The first optimizer step is the probe's object: AdamW's first step moves every weight with a gradient by ≈ lr
(m/√v = ±1 with bias correction), the largest relative step of a run; optim.warmup_steps is 0 in the probe so each
lr is measured as itself.

Every batch is rolled out once and handed to every (mode, lr), each starting from the same SFT weights
(benchmarks/step.py's method), so differences between lrs are the step's, not the sample's.
"""

from __future__ import annotations

import argparse
import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import results_record, write_json_atomic
from experiments import RESULTS_DIR
from seedfast.config import load_config
from seedfast.runtime.paths import RunPaths
from seedfast.runtime.profiling import PhaseTimer
from seedfast.train.draws import seed_everything
from seedfast.train.rl import Trainer

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "smollm2-135m_textworld_cpu.yaml"
INSIDE_SHARE = 0.99  # the rule's share of moved tokens inside the clip range
QUANTILES = (0.0, 0.005, 0.01, 0.05, 0.5, 0.95, 0.99, 0.995, 1.0)


@contextlib.contextmanager
def moved_ratios(trainer: Trainer, into: list[torch.Tensor]) -> Iterator[None]:
    """Collect exp(ℓθ − ℓold) of the weighted tokens of every fused-loss call made after the update's first
    optimizer step (the mini-batches whose θ has moved)."""
    import seedfast.train.update as update_mod

    steps = [0]
    original = update_mod.fused_loss

    def loss(hidden, weight, targets, **kwargs):
        out = original(hidden, weight, targets, **kwargs)
        old = kwargs.get("old_logprob")
        if steps[0] >= 1 and old is not None:
            active = kwargs["token_weights"] != 0
            into.append(torch.exp(out[2].detach() - old.detach())[active].double().cpu())
        return out

    handle = trainer.optimizer.register_step_post_hook(lambda *_: steps.__setitem__(0, steps[0] + 1))
    update_mod.fused_loss = loss
    try:
        yield
    finally:
        update_mod.fused_loss = original
        handle.remove()


def ratio_summary(ratios: torch.Tensor, low: float, high: float) -> dict[str, Any]:
    inside = ((ratios >= 1 - low) & (ratios <= 1 + high)).double().mean().item() if ratios.numel() else math.nan
    q = torch.quantile(ratios, torch.tensor(QUANTILES, dtype=torch.float64)).tolist() if ratios.numel() else []
    return {"tokens": int(ratios.numel()), "inside_share": inside,
            "quantiles": {f"{p:g}": v for p, v in zip(QUANTILES, q)}}


def ensure_sft(cfg: Any) -> Path:
    """The recipe's SFT start for this seed, made once (games, then `seedfast sft`) and kept in its run folder."""
    from seedfast.app import envs as envs_app
    from seedfast.sft import run as sft_run

    out = RunPaths.of(cfg).sft
    if not (out / "config.json").is_file():
        envs_app.main(cfg)
        sft_run.main(cfg)
    return out


def docs_table(result: dict) -> str:
    """The table of docs/demo.md (make docs): per mode and lr, the share of moved tokens inside the clip range in each
    batch, the ratios' 1st and 99th percentiles, and the lr the rule chose."""
    lines = ["| mode | lr | inside the clip range, per batch | ratio p1 – p99 (worst batch) | passes |",
             "|---|---|---|---|---|"]
    for mode, record in result["modes"].items():
        for row in record["rows"]:
            shares = ", ".join(f"{b['inside_share']:.4f}" for b in row["batches"])
            p1 = min(b["quantiles"]["0.01"] for b in row["batches"] if b["quantiles"])
            p99 = max(b["quantiles"]["0.99"] for b in row["batches"] if b["quantiles"])
            lines.append(f"| {mode} | {row['lr']:g} | {shares} | {p1:.3f} – {p99:.3f} | "
                         f"{'yes' if row['passes'] else 'no'} |")
    chosen = ", ".join(f"{mode} {r['chosen_lr']:g}" if r["chosen_lr"] else f"{mode}: none of the grid"
                       for mode, r in result["modes"].items())
    return "\n".join([*lines, "", f"Chosen by the rule ({result['rule']}): {chosen}. "
                      f"{result['machine']['cpu']}, `experiments/results/lr_probe.json`."])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(RECIPE))
    ap.add_argument("--name", default="lr_probe")
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--full-lrs", type=float, nargs="+", default=[1e-7, 3e-7, 1e-6, 3e-6, 1e-5])
    ap.add_argument("--lora-lrs", type=float, nargs="+", default=[1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4])
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--lora-alpha", type=float, default=32.0)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    base = [f"run.name={args.name}", "trainer.eval_every=0", "log.progress=false", "log.tensorboard=false",
            "optim.warmup_steps=0", *args.overrides]
    cfg = load_config(args.config, base)
    if cfg.trainer.mini_batches < 2 or cfg.trainer.ppo_epochs != 1:
        raise SystemExit("the probe reads the second mini-batch of one epoch: trainer.mini_batches must be >= 2, "
                         "trainer.ppo_epochs 1")
    sft = ensure_sft(cfg)
    base.append(f"trainer.init_from={sft}")
    low, high = cfg.loss.clip_low, cfg.loss.clip_high

    roller = Trainer(load_config(args.config, [*base, "run.name=" + args.name + "_roll"]))
    batches = []
    for b in range(args.batches):
        seed_everything(cfg.run.seed + b)
        batches.append(roller.rollout(b, PhaseTimer()))
    roller.close()

    lora = [f"model.lora.rank={args.lora_rank}", f"model.lora.alpha={args.lora_alpha}"]
    grids = {"full": (args.full_lrs, []), "lora": (args.lora_lrs, lora)}
    results: dict[str, Any] = {}
    for mode, (lrs, extra) in grids.items():
        rows = []
        for lr in sorted(lrs):
            per_batch = []
            for b, result in enumerate(batches):
                trainer = Trainer(load_config(args.config, [*base, *extra, f"optim.lr={lr}",
                                                            f"run.name={args.name}_{mode}"]))
                collected: list[torch.Tensor] = []
                seed_everything(cfg.run.seed + b)
                with moved_ratios(trainer, collected):
                    metrics = trainer.learn(b, result, PhaseTimer())
                trainer.close()
                ratios = torch.cat(collected) if collected else torch.zeros(0, dtype=torch.float64)
                per_batch.append({**ratio_summary(ratios, low, high),
                                  "success": metrics.get("train/success_rate"),
                                  "groups_with_signal": metrics.get("train/groups_with_signal")})
            passed = all(r["inside_share"] >= INSIDE_SHARE for r in per_batch)
            rows.append({"lr": lr, "passes": passed, "batches": per_batch})
            print(f"{mode} lr {lr:g}: inside " + ", ".join(f"{r['inside_share']:.4f}" for r in per_batch)
                  + (" pass" if passed else " FAIL"), flush=True)
        chosen = None
        for row in rows:  # ascending: the largest lr before the first failure
            if not row["passes"]:
                break
            chosen = row["lr"]
        results[mode] = {"rows": rows, "chosen_lr": chosen, "extra": extra}
    payload = results_record(args.name, {
        "config": str(Path(args.config).resolve().relative_to(ROOT)), "overrides": base,
        "rule": f"largest lr whose moved mini-batch keeps >= {INSIDE_SHARE:.0%} of its response tokens' ratios inside "
                f"[{1 - low:g}, {1 + high:g}] in every one of {args.batches} batches (experiments/lr_probe.py)",
        "clip_range": [1 - low, 1 + high], "sft_start": str(sft), "modes": results,
    }, packages=("torch", "transformers", "seedfast"))
    write_json_atomic(RESULTS_DIR / f"{args.name}.json", payload)
    print({mode: r["chosen_lr"] for mode, r in results.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
