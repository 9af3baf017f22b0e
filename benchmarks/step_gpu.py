"""One RL step on a random-init model, SEED vs GRPO: tokens/s, MFU and peak memory by phase (the GPU window's step).

    python -m benchmarks.step_gpu --shape qwen1.5b --device cuda --dtype bf16 --out OUT/step_gpu.json
    python -m benchmarks.step_gpu --shape tiny --device cpu                 # the same code on a tiny shape (tests)

The model is seedfast's decoder with the published Qwen2.5-1.5B sizes (benchmarks/peers.py SHAPES, the values of
transformers' Qwen2Config for Qwen/Qwen2.5-1.5B), random init: no download, no tokenizer, nothing installed; it
needs torch and this repository only. A step is what Trainer.learn does around a rollout (seedfast/train/rl.py),
on synthetic token ids in place of game text:
- rollout: the own sampler (seedfast/rollout/own_engine.py) generates `response` tokens for `trajectories`
  copies of each task's prompt (no stop ids, so every response has the full length);
- analyze (SEED only): the policy writes a `skill` of that many tokens per trajectory from prompt ⊕ response;
- ref: ℓref by score_reference on prompt ⊕ response;
- update: minibatch_loss_backward (fused loss; SEED: the teacher on the prefix KV with the skill inserted
  before the response), gradient clipping, AdamW. GRPO and SEED use the same rollout, weights and rewards.
Tokens/s counts the tokens each phase processes (generated tokens for rollout and analyze, prompt ⊕ response
tokens for ref and update). MFU = model FLOPs / time / the GPU's dense bf16 peak (a table of known GPUs below;
null elsewhere, and on CPU): per processed token 2 x non-embedding parameters + 2 d V for the LM head, plus causal
attention 4 x layers x q_dim x (context) per token; training = 3 x forward; the SEED teacher branch = one forward
of skill ⊕ response over the prefix. Recomputation, the sampler's prefill and the optimizer are not counted (MFU is
the useful work). Peak memory: CUDA max allocated above the level before the step (model, reference model and
Adam moments excluded), CPU: peak RSS above entry (benchmarks/common.py PeakRSS).

Beside these, each row carries verl's own two numbers, so that seedfast can be put next to verl's published runs
(docs/performance.md, "Against verl"): `verl.tokens_per_s_per_gpu` = (prompt + response tokens of the batch) / step
time / GPUs (verl's perf/throughput), and `verl.mfu_actor` = verl's FlopsCounter estimate for the actor update
(6 x (non-attention parameters + 2 V d for embedding and LM head) x tokens + 12 x Σ seqlen² x head_dim x heads x
layers) / update time / GPUs / the device's promised dense bf16 peak (verl's perf/mfu/actor, one PPO epoch). verl's
formula counts neither SEED's teacher forward nor causal halving of attention: it is a convention, not the work done.
`--gpus` divides by the GPUs the step stands for; `--peak-tflops` states a peak where the table has none.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from pathlib import Path

import torch

from benchmarks.common import PeakRSS, git_commit, machine_info, write_json_atomic
from benchmarks.peers import SHAPES

# dense bf16 tensor-core peak FLOP/s by device name (vendor data sheets, SXM parts); matched by substring
PEAK_BF16 = {"H200": 989.4e12, "H100 PCIe": 756e12, "H100": 989.4e12, "A100": 312e12, "L40S": 362e12,
             "A10G": 70e12, "L4": 121e12}
BATCHES = {"tiny": dict(tasks=2, trajectories=4, prompt=48, response=12, skill=6, budget=512),
           "qwen1.5b": dict(tasks=8, trajectories=8, prompt=1024, response=256, skill=128, budget=16384)}
PHASES = ("rollout", "analyze", "ref", "update")


def peak_flops(device: str, dtype: torch.dtype) -> float | None:
    if device != "cuda" or dtype != torch.bfloat16:
        return None
    name = torch.cuda.get_device_name(0)
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def forward_flops(cfg: dict, lengths: list[tuple[int, int]]) -> float:
    """Model FLOPs of a forward over sequences given as (context before, new tokens): per new token 2 x the
    non-embedding parameters + 2 d V (LM head), plus causal attention (QKᵀ and AV) over its context."""
    d, v, layers = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    hd = d // cfg["num_attention_heads"]
    q, kv, ff = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd, cfg["intermediate_size"]
    per_layer = d * q + 2 * d * kv + q * d + 3 * d * ff  # projections and the gated MLP (norms and biases: noise)
    flops = 0.0
    for before, new in lengths:
        flops += new * (2 * layers * per_layer + 2 * d * v)
        flops += 4 * layers * q * (new * before + new * (new + 1) / 2)  # token t attends to before + t + 1 keys
    return flops


def verl_flops(cfg: dict, seqlens: list[int]) -> float:
    """verl's FlopsCounter for a Qwen2/Llama actor update over sequences of `seqlens` tokens (fwd + bwd)."""
    d, v, layers = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = d // heads
    mlp = d * cfg["intermediate_size"] * 3
    attn_linear = d * (heads * head_dim + 2 * kv_heads * head_dim + heads * head_dim)
    dense = (mlp + attn_linear) * layers + 2 * v * d
    return 6.0 * dense * sum(seqlens) + 12.0 * sum(s * s for s in seqlens) * head_dim * heads * layers


def verl_metrics(cfg: dict, seqlens: list[int], step_s: float, update_s: float, gpus: int,
                 peak: float | None) -> dict:
    """verl's perf/throughput (tokens/s/GPU) and perf/mfu/actor for one step."""
    flops = verl_flops(cfg, seqlens)
    return {"tokens": sum(seqlens), "step_s": step_s, "update_s": update_s, "gpus": gpus,
            "tokens_per_s_per_gpu": sum(seqlens) / step_s / gpus,
            "actor_flops": flops, "mfu_actor": flops / update_s / gpus / peak if peak and update_s else None}


def make_prompts(batch: dict, vocab: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (batch["prompt"],), generator=gen).tolist() for _ in range(batch["tasks"])]


class Clock:
    def __init__(self, device: str) -> None:
        self.device, self.seconds = device, {}

    def __call__(self, name: str, fn):
        if self.device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = fn()
        if self.device == "cuda":
            torch.cuda.synchronize()
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t
        return out


def one_step(algo: str, policy, ref, optimizer, prompts: list[list[int]], batch: dict, clock: Clock,
             seed: int) -> dict:
    """One RL step of `algo` ("seed" or "grpo"); returns the loss and the tokens of each phase."""
    from seedfast.algo import advantage as adv_math
    from seedfast.config import LossConfig
    from seedfast.rollout.own_engine import Sampler
    from seedfast.runtime.optim import grad_norm_and_clip
    from seedfast.sampling_params import SamplingParams
    from seedfast.scoring import StepSample, score_reference
    from seedfast.train.update import UpdateBatch, minibatch_loss_backward

    n, loss_cfg = batch["trajectories"], LossConfig()
    sampler = Sampler(policy, seed=seed)
    expanded = [p for p in prompts for _ in range(n)]
    responses = clock("rollout", lambda: sampler.generate(expanded, SamplingParams(batch["response"])))
    skills = None
    if algo == "seed":  # the policy writes one skill per trajectory, from what it did
        skills = clock("analyze", lambda: sampler.generate([p + r for p, r in zip(expanded, responses)],
                                                          SamplingParams(batch["skill"])))
    gen = torch.Generator().manual_seed(seed)
    rewards = (torch.rand(len(expanded), generator=gen) < 0.4).float()
    samples = []
    for i, (p, r) in enumerate(zip(expanded, responses)):
        extra = {"insert_at": len(p) - 8, "privileged_ids": skills[i], "teacher_valid": True} if skills else {}
        samples.append(StepSample(prompt_ids=p, response_ids=r, sample_id=i, reward=float(rewards[i]),
                                  group_id=i // n, **extra))
    ref_lp = clock("ref", lambda: score_reference(ref, samples, token_budget=batch["budget"]).logprob)
    advantages = adv_math.grpo_with_penalty(rewards, torch.zeros_like(rewards), [s.group_id for s in samples],
                                            norm=loss_cfg.adv_norm, eps=loss_cfg.adv_eps,
                                            penalty_mode=loss_cfg.step_penalty)
    update = UpdateBatch(samples, advantages, None, ref_logprob=ref_lp, teacher_from_forward=algo == "seed")

    def learn() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss, _ = minibatch_loss_backward(policy, update, list(range(len(samples))), loss_cfg, use_kl=True,
                                          use_opd=algo == "seed", temperature=1.0, token_budget=batch["budget"])
        grad_norm_and_clip(optimizer, 1.0)
        optimizer.step()
        return loss

    loss = clock("update", learn)
    seqs = [(0, len(p) + len(r)) for p, r in zip(expanded, responses)]
    gen_tokens = sum(len(r) for r in responses)
    return {"loss": loss, "tokens": {"rollout": gen_tokens, "analyze": sum(map(len, skills)) if skills else 0,
                                     "ref": sum(b for _, b in seqs), "update": sum(b for _, b in seqs)},
            "lengths": {"rollout": [(len(p), len(r)) for p, r in zip(expanded, responses)],
                        "analyze": [(len(p) + len(r), len(s)) for p, r, s in zip(expanded, responses, skills)]
                        if skills else [],
                        "ref": seqs, "update": seqs,
                        "teacher": [(len(p) - 8, len(s) + 8 + len(r)) for p, r, s in zip(expanded, responses, skills)]
                        if skills else []}}


def phase_flops(cfg: dict, lengths: dict) -> dict[str, float]:
    f = {name: forward_flops(cfg, lengths[name]) for name in PHASES}
    f["update"] = 3 * f["update"] + forward_flops(cfg, lengths["teacher"])
    return f


def run(args: argparse.Namespace, on_row=None) -> dict:
    """Both algorithms' steps; `on_row(result so far)` after each (the GPU window writes its JSON as it goes)."""
    from seedfast.model.config import DecoderConfig
    from seedfast.model.decoder import build_decoder
    from seedfast.runtime.optim import adamw

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    cfg = dict(SHAPES[args.shape]["model"])
    if args.layers:
        cfg["num_hidden_layers"] = args.layers
    batch = dict(BATCHES[args.shape])
    torch.manual_seed(0)
    start = build_decoder(DecoderConfig(**cfg), dtype=dtype, device=args.device, seed=0,
                          attn_backend=args.attn or ("sdpa" if args.device == "cpu" else "auto"))
    ref = copy.deepcopy(start).eval().requires_grad_(False)
    prompts = make_prompts(batch, cfg["vocab_size"])
    peak = args.peak_tflops * 1e12 if args.peak_tflops else peak_flops(args.device, dtype)
    rows = []
    header = {"shape": args.shape, "model": cfg, "batch": batch, "device": args.device, "dtype": args.dtype,
              "attn": args.attn or "auto", "autotune_one": os.environ.get("SEEDFAST_AUTOTUNE_ONE") == "1",
              "reps": args.reps, "peak_bf16_flops": peak, "machine": machine_info(),
              "commit": args.commit or git_commit(), "torch": torch.__version__, "rows": rows}
    for algo in ("grpo", "seed"):
        policy = copy.deepcopy(start).train()
        optimizer = adamw(list(policy.parameters()), lr=1e-6, weight_decay=0.0)
        one_step(algo, policy, ref, optimizer, prompts, batch, Clock(args.device), seed=99)  # warm-up: kernels
        reps = []
        for rep in range(args.reps):
            clock = Clock(args.device)
            if args.device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                out = one_step(algo, policy, ref, optimizer, prompts, batch, clock, seed=rep)
                torch.cuda.synchronize()
                peak_bytes = torch.cuda.max_memory_allocated() - base
            else:
                with PeakRSS() as probe:
                    out = one_step(algo, policy, ref, optimizer, prompts, batch, clock, seed=rep)
                peak_bytes = probe.extra_bytes
            reps.append((clock.seconds, out, peak_bytes))
        seconds, out, peak_bytes = min(reps, key=lambda r: sum(r[0].values()))  # the fastest rep
        flops = phase_flops(cfg, out["lengths"])
        phases = {}
        for name in PHASES:
            s = seconds.get(name, 0.0)
            phases[name] = {"s": round(s, 4), "tokens": out["tokens"][name],
                            "tokens_per_s": round(out["tokens"][name] / s, 1) if s else None,
                            "tflop": round(flops[name] / 1e12, 4),
                            "mfu": round(flops[name] / s / peak, 4) if s and peak else None}
        total_s = sum(seconds.values())
        rows.append({"algorithm": algo, "loss": out["loss"], "step_s": round(total_s, 4),
                     "update_tokens_per_s": phases["update"]["tokens_per_s"],
                     "step_tokens_per_s": round(out["tokens"]["update"] / total_s, 1),
                     "step_mfu": round(sum(flops.values()) / total_s / peak, 4) if peak else None,
                     "peak_extra_bytes": int(peak_bytes), "phases": phases,
                     "verl": verl_metrics(cfg, [b for _, b in out["lengths"]["update"]], total_s, seconds["update"],
                                          args.gpus, peak)})
        del policy, optimizer
        if args.device == "cuda":
            torch.cuda.empty_cache()
        rows[-1]["step_vs_grpo"] = round(rows[-1]["step_s"] / rows[0]["step_s"], 3)
        if on_row:
            on_row({**header, "partial": len(rows) < 2})
    return {**header, "partial": False}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(BATCHES), default="qwen1.5b")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default=None, help="default: bf16 on cuda, fp32 on cpu")
    ap.add_argument("--layers", type=int, default=None, help="cut the depth (a quick look)")
    ap.add_argument("--reps", type=int, default=2, help="measured steps per algorithm after one warm-up")
    ap.add_argument("--out", default=None, help="JSON path, rewritten after each algorithm (default: print only)")
    ap.add_argument("--attn", default=None, choices=["auto", "sdpa", "flex", "flash"],
                    help="attention backend (default: auto on CUDA, sdpa on CPU); the GPU window runs sdpa: flex "
                         "compiles under torch.compile, which a cold window cannot afford")
    ap.add_argument("--commit", default=os.environ.get("SEEDFAST_COMMIT"),
                    help="the commit measured (default: $SEEDFAST_COMMIT, else git; the window's tree has no .git)")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs the step stands for (verl's tokens/s/GPU, MFU)")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="the device's dense bf16 peak, TFLOP/s (default: the table of known GPUs; none on CPU)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here (use --device cpu --shape tiny)")
    if args.gpus < 1:
        ap.error(f"--gpus must be >= 1, got {args.gpus}")
    if args.reps < 1:
        ap.error(f"--reps must be >= 1, got {args.reps}")
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    result = run(args, on_row=(lambda partial: write_json_atomic(Path(args.out), partial)) if args.out else None)
    for row in result["rows"]:
        ph = " ".join(f"{k}={v['s']:.3f}s" for k, v in row["phases"].items())
        print(f"{row['algorithm']:5s} step {row['step_s']:.3f}s ({row['step_vs_grpo']:.2f}x grpo) {ph} "
              f"update {row['update_tokens_per_s']} tok/s mfu(step) {row['step_mfu']} "
              f"verl: {row['verl']['tokens_per_s_per_gpu']:.1f} tok/s/GPU mfu(actor) {row['verl']['mfu_actor']} "
              f"peak +{row['peak_extra_bytes'] / 2**20:.0f} MiB loss {row['loss']:.4f}")
    if args.out:
        write_json_atomic(Path(args.out), result)
    else:
        print(json.dumps({k: v for k, v in result.items() if k != "machine"})[:2000])
    return result


if __name__ == "__main__":
    main()
