"""One RL update side by side: seedfast vs the reference recipe (and Liger-Kernel), time by phase and peak memory.

    python -m benchmarks.peers --shape tiny          # the demo's tiny model at the demo's batch
    python -m benchmarks.peers --shape qwen0.5b      # Qwen2.5-0.5B shape, random init (--layers N to cut depth)
    python -m benchmarks.peers --shape qwen0.5b --algos seed --legs reference seedfast --checkpointing
    python -m benchmarks.peers --shape qwen7b --device cuda --dtype bf16 --out OUT/peers_cuda.json   # on a GPU

The same step samples (prompt, insertion point, skill, response, reward, group), the same weights (one HF folder
written by seedfast.model.save_hf) and the same hyper-parameters (the defaults of seedfast.config's LossConfig and
OptimConfig) go to three recipes, each in its own fresh process, for one SEED update and one GRPO update:
- reference: transformers' *ForCausalLM, separate ℓold / ℓref / ℓskill forwards with materialized logits, the
  teacher over the whole rebuilt skill-augmented prompt, the loss of docs/algorithms.md written out again,
  backward through the logits, AdamW (benchmarks/peers_reference.py);
- liger: the same with LigerFusedLinearGRPOLoss for the update's policy term + KL (skipped when it does not import);
- seedfast: the trainer's own path (seedfast/train/rl.py Trainer.learn and _update): score_reference for ℓref,
  then minibatch_loss_backward (fused loss, no logits; on-policy, so no ℓold pass; ℓskill from the update
  forward's own prefix KV), grad_norm_and_clip, AdamW.
The first update of each process (from the same start weights) is checked: loss, clipped gradients and updated
weights against the reference. Its peak memory is measured: CPU = the process's peak resident set above the level
before the update (VmHWM after clear_refs, benchmarks/common.py PeakRSS; glibc's mmap threshold pinned so freed
blocks go back to the OS); CUDA = torch.cuda.max_memory_allocated above the allocated level before. Before it, each
process runs one update on two short samples (imports, thread pools, first touch) and goes back to the start weights;
Adam's moments exist before the update (zeros: the state AdamW creates lazily), as in every update after the first.
Wall time by phase: the median over --reps further updates (or the first update when --reps 0).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from benchmarks.common import (
    RESULTS_DIR,
    PeakRSS,
    command_line,
    git_commit,
    machine_info,
    median,
    print_table,
    run_worker,
    versions,
    write_json_atomic,
)

LEGS = ("reference", "liger", "seedfast")
ALGOS = ("seed", "grpo")
OPD_MODES = ("gate", "advantage", "reverse_kl", "jsd")  # loss.opd_mode (seedfast.algo.losses.OPD_MODES)
PHASES = ("old", "ref", "teacher", "forward", "backward", "fwd_bwd", "optimizer")
MALLOC_PINNED = {"MALLOC_MMAP_THRESHOLD_": "131072"}
WARMUP_BATCH = dict(tasks=1, trajectories=2, prompt=24, skill=4, response=4)
TOKEN_BUDGET = 16384
FULL_CHECK_PARAMS = 300_000_000  # trainer.micro_batch_tokens' default: every shape here fits one micro-batch

# model: seedfast DecoderConfig fields; batch: tasks × trajectories step samples, token lengths
SHAPES = {
    "tiny": {"model": dict(model_type="qwen3", vocab_size=1500, hidden_size=128, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, intermediate_size=384,
                           tie_word_embeddings=True, max_position_embeddings=1024),
             "batch": dict(tasks=4, trajectories=8, prompt=200, skill=32, response=8), "reps": 3},
    "qwen0.5b": {"model": dict(model_type="qwen2", vocab_size=151936, hidden_size=896, num_hidden_layers=24,
                               num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
                               tie_word_embeddings=True, max_position_embeddings=4096, rope_theta=1e6),
                 "batch": dict(tasks=2, trajectories=4, prompt=512, skill=64, response=32), "reps": 0},
    "qwen1.5b": {"model": dict(model_type="qwen2", vocab_size=151936, hidden_size=1536, num_hidden_layers=28,
                               num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960,
                               tie_word_embeddings=True, max_position_embeddings=4096, rope_theta=1e6),
                 "batch": dict(tasks=2, trajectories=4, prompt=512, skill=64, response=32), "reps": 2},
    "qwen7b": {"model": dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, num_hidden_layers=28,
                             num_attention_heads=28, num_key_value_heads=4, intermediate_size=18944,
                             tie_word_embeddings=False, max_position_embeddings=4096, rope_theta=1e6),
               "batch": dict(tasks=2, trajectories=4, prompt=512, skill=64, response=32), "reps": 2},
}


# ----------------------------------------------------------------------------------------- inputs

def hyper_params() -> dict:
    """The trainer's defaults (seedfast.config LossConfig / OptimConfig), shared by every recipe."""
    from seedfast.config import LossConfig, OptimConfig

    loss, optim = LossConfig(), OptimConfig()
    assert (loss.kl_kind, loss.gate, loss.agg, loss.adv_norm) == ("low_var_kl", "gap", "token-mean", "mean_std"), \
        "benchmarks/peers_reference.py writes out the default options only"
    return {"clip_low": loss.clip_low, "clip_high": loss.clip_high, "dual_clip": loss.dual_clip,
            "kl_coef": loss.kl_coef, "entropy_coef": loss.entropy_coef, "opd_coef": loss.opd_coef,
            "opd_beta": loss.opd_beta, "adv_eps": loss.adv_eps, "lr": optim.lr, "weight_decay": optim.weight_decay,
            "betas": tuple(optim.betas), "eps": optim.eps, "grad_clip": optim.grad_clip, "temperature": 1.0}


def insertion_index(prompt_len: int, insertion: str) -> int:
    """Synthetic prompts: the task line ends at token 48; the assistant turn opens 8 tokens before the end."""
    return {"prepend": 0, "after_task": min(48, prompt_len - 1), "before_response": prompt_len - 8}[insertion]


def make_samples(batch: dict, vocab: int, insertion: str, seed: int = 0) -> list[dict]:
    """Synthetic step samples: prompts ±10% around batch["prompt"] tokens, one skill per trajectory (the last
    trajectory of every other group failed to parse: no teacher), rewards with a win and a loss per group."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = lambda n: torch.randint(0, vocab, (n,), generator=gen).tolist()  # noqa: E731
    spread = batch["prompt"] // 10
    samples = []
    for g in range(batch["tasks"]):
        for j in range(batch["trajectories"]):
            n_prompt = batch["prompt"] + int(torch.randint(-spread, spread + 1, (1,), generator=gen))
            reward = 1.0 if j == 0 else 0.0 if j == 1 else float(torch.rand(1, generator=gen) < 0.4)
            samples.append({"prompt": ids(n_prompt), "k": insertion_index(n_prompt, insertion),
                            "skill": ids(batch["skill"]), "response": ids(batch["response"]), "reward": reward,
                            "group": g, "skill_valid": not (g % 2 == 0 and j == batch["trajectories"] - 1)})
    return samples


def model_config(shape: str, layers: int | None) -> dict:
    cfg = dict(SHAPES[shape]["model"])
    if layers:
        cfg["num_hidden_layers"] = layers
    return cfg


def write_checkpoint(config: dict, folder: Path, seed: int = 0) -> Path:
    """A random-init seedfast decoder saved as an HF folder (fp32): both seedfast and transformers load it."""
    import torch

    from seedfast.model import save_hf
    from seedfast.model.config import DecoderConfig
    from seedfast.model.decoder import build_decoder

    model = build_decoder(DecoderConfig(**config), dtype=torch.float32, seed=seed)
    save_hf(model, folder)
    return folder


# ----------------------------------------------------------------------------------------- timing

class Phases:
    """Wall seconds per named phase (a phase may run several times: summed); `sync` finishes device work."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.sync = sync or (lambda: None)

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


@contextlib.contextmanager
def timed_teacher(phase: Phases) -> Iterator[None]:
    """Time the teacher branch inside seedfast's update (the function minibatch_loss_backward calls)."""
    import seedfast.train.update as update

    original = update.teacher_logprob_with_prefix

    def wrapped(*args, **kwargs):
        with phase("teacher"):
            return original(*args, **kwargs)

    update.teacher_logprob_with_prefix = wrapped
    try:
        yield
    finally:
        update.teacher_logprob_with_prefix = original


# ----------------------------------------------------------------------------------------- the seedfast leg

def step_samples(samples: list[dict]) -> list:
    from seedfast.scoring import StepSample

    out = []
    for i, s in enumerate(samples):
        skill = {"insert_at": s["k"], "privileged_ids": s["skill"]} if s["skill_valid"] else {}
        out.append(StepSample(prompt_ids=s["prompt"], response_ids=s["response"], sample_id=i, reward=s["reward"],
                              group_id=s["group"], teacher_valid=s["skill_valid"], **skill))
    return out


def seedfast_update(policy, ref, optimizer, samples: list, hp: dict, use_opd: bool, phase: Phases,
                    opd_mode: str = "gate") -> float:
    """What Trainer.learn does after the rollout (seedfast/train/rl.py), on-policy: ℓref by score_reference,
    GRPO advantages, one mini-batch through minibatch_loss_backward, grad clip, optimizer step; `opd_mode` is
    loss.opd_mode (the teacher term's form, --opd-modes)."""
    import torch

    from seedfast.algo import advantage as adv_math
    from seedfast.config import LossConfig
    from seedfast.runtime.optim import grad_norm_and_clip
    from seedfast.scoring import score_reference
    from seedfast.train.update import UpdateBatch, minibatch_loss_backward

    loss_cfg = LossConfig(opd_mode=opd_mode)
    optimizer.zero_grad(set_to_none=True)
    with phase("ref"):
        ref_lp = score_reference(ref, samples, token_budget=TOKEN_BUDGET, temperature=hp["temperature"]).logprob
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    advantages = adv_math.grpo_with_penalty(rewards, torch.zeros_like(rewards), [s.group_id for s in samples],
                                            norm=loss_cfg.adv_norm, eps=loss_cfg.adv_eps,
                                            penalty_mode=loss_cfg.step_penalty)
    batch = UpdateBatch(samples, advantages, None, ref_logprob=ref_lp, teacher_from_forward=use_opd)
    with phase("fwd_bwd"), timed_teacher(phase):
        loss, _ = minibatch_loss_backward(policy, batch, list(range(len(samples))), loss_cfg, use_kl=True,
                                          use_opd=use_opd, temperature=hp["temperature"], token_budget=TOKEN_BUDGET)
    with phase("optimizer"):
        grad_norm_and_clip(optimizer, hp["grad_clip"])
        optimizer.step()
    return loss


# ----------------------------------------------------------------------------------------- one worker process

def load_models(leg: str, ckpt: Path, device: str, dtype: str, checkpointing: bool = False):
    """(policy, ref) of `leg` from the folder; with `checkpointing` the policy recomputes each layer in backward
    (activation checkpointing, the library's own switch on each side)."""
    import torch

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    if leg == "seedfast":
        from seedfast.model import load_hf

        backend = "sdpa" if device == "cpu" else "auto"
        policy, ref = (load_hf(ckpt, dtype=torch_dtype, device=device, attn_backend=backend) for _ in range(2))
    else:
        from transformers import AutoModelForCausalLM

        policy, ref = (AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch_dtype, attn_implementation="sdpa")
                       .to(device) for _ in range(2))
    if checkpointing and leg == "seedfast":
        policy.gradient_checkpointing = True
    elif checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy.train()
    ref.eval()
    ref.requires_grad_(False)
    return policy, ref


def make_optimizer(model, hp: dict, leg: str):
    """AdamW with the trainer's hyper-parameters, its moments created up front (zeros, step 0: what AdamW
    creates lazily in its first step), so that every update's peak is measured in the same steady state.
    seedfast's leg uses the trainer's own optimizer (torch's fused AdamW where available, sft/loop.py
    `adamw`); the reference and Liger recipes torch's default AdamW, as verl-based code does."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    options = dict(lr=hp["lr"], weight_decay=hp["weight_decay"], betas=hp["betas"], eps=hp["eps"])
    if leg == "seedfast":
        from seedfast.runtime.optim import adamw

        optimizer = adamw(params, **options)
    else:
        optimizer = torch.optim.AdamW(params, **options)
    for p in params:
        optimizer.state[p].update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p),
                                  exp_avg_sq=torch.zeros_like(p))
    return optimizer


def make_update(leg: str, algo: str, policy, ref, optimizer, samples: list[dict], hp: dict, device: str,
                opd_mode: str = "gate") -> Callable[[Phases], float]:
    """A closure running one update of `leg` for `algo` on `samples`; it returns the loss."""
    from benchmarks import peers_reference as reference

    use_opd = algo == "seed"
    if leg == "seedfast":
        steps = step_samples(samples)
        return lambda phase: seedfast_update(policy, ref, optimizer, steps, hp, use_opd, phase, opd_mode)
    x = reference.build_inputs(samples, hp, use_opd, device)
    if leg == "reference":
        return lambda phase: reference.reference_update(policy, ref, optimizer, x, hp, use_opd, phase)
    loss_fn = reference.liger_loss_fn(hp)
    return lambda phase: reference.liger_update(policy, ref, optimizer, x, hp, use_opd, phase, loss_fn)


@contextlib.contextmanager
def peak_memory(device: str) -> Iterator[dict]:
    """{"peak_extra_bytes", "memory_method"} of the block: CPU peak RSS, or CUDA max allocated, above entry."""
    out: dict = {}
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        yield out
        torch.cuda.synchronize()
        out.update(peak_extra_bytes=torch.cuda.max_memory_allocated() - base,
                   memory_method="torch.cuda.max_memory_allocated above entry")
        return
    with PeakRSS() as probe:
        yield out
    out.update(peak_extra_bytes=probe.extra_bytes, memory_method=f"peak RSS above entry ({probe.method})")


def checked_names(model) -> list[str]:
    """Parameters the conformance check compares: all of them, or for models above FULL_CHECK_PARAMS (GPU shapes)
    the embedding / LM head, the final norm and the last layer, so that the dumps stay a few GB."""
    named = dict(model.named_parameters())
    if sum(p.numel() for p in named.values()) <= FULL_CHECK_PARAMS:
        return list(named)
    last = f"layers.{model.config.num_hidden_layers - 1}."
    return [n for n in named if "embed_tokens" in n or "lm_head" in n or n == "model.norm.weight" or last in n]


def dump_state(model, path: Path) -> None:
    """The clipped gradients and the updated weights, for the conformance check in the parent."""
    from safetensors.torch import save_file

    tensors = {}
    keep = set(checked_names(model))
    for name, p in model.named_parameters():
        if name not in keep:
            continue
        tensors[f"weight/{name}"] = p.detach().float().cpu().contiguous()
        if p.grad is not None:
            tensors[f"grad/{name}"] = p.grad.detach().float().cpu().contiguous()
    save_file(tensors, str(path))


def worker(args: argparse.Namespace) -> dict:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    hp = hyper_params()
    policy, ref = load_models(args.leg, Path(args.ckpt), args.device, args.dtype, args.checkpointing)
    optimizer = make_optimizer(policy, hp, args.leg)
    cfg = model_config(args.shape, args.layers)
    samples = make_samples(SHAPES[args.shape]["batch"], cfg["vocab_size"], args.insertion)
    update = make_update(args.leg, args.algo, policy, ref, optimizer, samples, hp, args.device, args.opd_mode)
    sync = torch.cuda.synchronize if args.device == "cuda" else None
    warm_up(args, policy, ref, optimizer, hp, cfg["vocab_size"])
    gc.collect()
    phase = Phases(sync)
    with peak_memory(args.device) as mem:
        start = time.perf_counter()
        loss = update(phase)
        first_s = time.perf_counter() - start
    if args.dump:
        dump_state(policy, Path(args.dump))
    runs = []
    for _ in range(args.reps):
        p = Phases(sync)
        start = time.perf_counter()
        update(p)
        runs.append({"total": time.perf_counter() - start, **p.seconds})
    timed = runs or [{"total": first_s, **phase.seconds}]
    return {"loss": loss, "first_update_s": first_s, "runs": runs, "torch_threads": torch.get_num_threads(),
            "phases_s": summarize(timed), **mem}


def warm_up(args: argparse.Namespace, policy, ref, optimizer, hp: dict, vocab: int) -> None:
    """One update on two short samples (imports, thread pools, first-touch), then back to the start weights and a
    fresh optimizer state, so that the measured update starts where every other process's does."""
    import torch

    start = {name: p.detach().clone() for name, p in policy.named_parameters()}
    small = make_samples(WARMUP_BATCH, vocab, args.insertion, seed=1)
    make_update(args.leg, args.algo, policy, ref, optimizer, small, hp, args.device, args.opd_mode)(Phases())
    with torch.no_grad():
        for name, p in policy.named_parameters():
            p.copy_(start[name])
            p.grad = None
            state = optimizer.state[p]
            state["step"].zero_()
            state["exp_avg"].zero_()
            state["exp_avg_sq"].zero_()


def summarize(runs: list[dict]) -> dict[str, float]:
    """Median seconds per phase; fwd_bwd = forward + backward (seedfast: the fused update, teacher excluded)."""
    out = {k: median([r.get(k, 0.0) for r in runs]) for k in ("total", *PHASES)}
    if out["forward"] or out["backward"]:
        out["fwd_bwd"] = out["forward"] + out["backward"]
    else:
        out["fwd_bwd"] -= out["teacher"]
    return out


# ----------------------------------------------------------------------------------------- the parent

def liger_version() -> str | None:
    try:
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure to import means "not available" on this machine
        return None
    return versions("liger-kernel")["liger-kernel"] or "unknown"


def run_leg(args: argparse.Namespace, leg: str, algo: str, ckpt: Path, dump: Path, opd_mode: str = "gate") -> dict:
    argv = ["-m", __spec__.name, "--worker", leg, algo, "--shape", args.shape, "--ckpt", str(ckpt),
            "--device", args.device,
            "--dtype", args.dtype, "--insertion", args.insertion, "--reps", str(args.reps), "--dump", str(dump)]
    for flag, value in (("--layers", args.layers), ("--threads", args.threads)):
        if value:
            argv += [flag, str(value)]
    if args.checkpointing:
        argv.append("--checkpointing")
    if opd_mode != "gate":
        argv += ["--opd-mode", opd_mode]
    try:
        return run_worker(argv, timeout=args.timeout, env=MALLOC_PINNED)
    except RuntimeError as err:  # e.g. killed for memory: a result too
        text = str(err)
        killed = "(-9)" in text or "out of memory" in text.lower()
        return {"error": "out of memory" if killed else text.splitlines()[0], "detail": text[-2000:]}


def conformance(ref_dump: Path, other_dump: Path, ckpt: Path) -> dict[str, float]:
    """Max abs differences of the clipped gradients and updated weights against the reference, plus the scale of
    each (largest gradient, largest weight change of the reference update), so that the diffs can be read."""
    from safetensors.torch import load_file

    a, b = load_file(str(ref_dump)), load_file(str(other_dump))
    start = {}
    for f in ckpt.glob("*.safetensors"):
        start.update(load_file(str(f)))
    grads = [k for k in a if k.startswith("grad/")]
    weights = [k for k in a if k.startswith("weight/")]
    return {
        "grad_max_abs_diff": max(float((a[k] - b[k]).abs().max()) for k in grads),
        "grad_max_abs": max(float(a[k].abs().max()) for k in grads),
        "weight_max_abs_diff": max(float((a[k] - b[k]).abs().max()) for k in weights),
        "weight_change_max_abs": max(float((a[k] - start[k[len("weight/"):]]).abs().max()) for k in weights),
    }


def add_ratios(rows: list[dict]) -> None:
    base = next((r for r in rows if r["leg"] == "reference" and "phases_s" in r), None)
    for r in rows:
        if base is None or "phases_s" not in r:
            continue
        r["time_vs_reference"] = r["phases_s"]["total"] / base["phases_s"]["total"]
        r["memory_vs_reference"] = r["peak_extra_bytes"] / max(base["peak_extra_bytes"], 1)
        r["loss_abs_diff"] = abs(r["loss"] - base["loss"])


def run_shape(args: argparse.Namespace) -> dict:
    liger = liger_version()
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="seedfast_peers_") as tmp:
        ckpt = write_checkpoint(model_config(args.shape, args.layers), Path(tmp) / "hf")
        for algo in args.algos:
            rows = []
            for leg in args.legs:
                if leg == "liger" and liger is None:
                    rows.append({"leg": leg, "error": "skipped: liger_kernel does not import here"})
                    continue
                dump = Path(tmp) / f"{algo}_{leg}.safetensors"
                row = {"leg": leg, **run_leg(args, leg, algo, ckpt, dump)}
                print(f"  {args.shape} {algo} {leg}: " + (row.get("error") or
                      f"{row['phases_s']['total']:.2f} s, +{row['peak_extra_bytes'] / 2**20:.0f} MiB"),
                      file=sys.stderr)
                rows.append(row)
            ref_dump = Path(tmp) / f"{algo}_reference.safetensors"
            for row in rows:
                dump = Path(tmp) / f"{algo}_{row['leg']}.safetensors"
                if row["leg"] != "reference" and "error" not in row and ref_dump.exists():
                    row["conformance"] = conformance(ref_dump, dump, ckpt)
            for dump in Path(tmp).glob(f"{algo}_*.safetensors"):
                dump.unlink()
            add_ratios(rows)
            results[algo] = rows
    return {"liger_kernel": liger or "not available", "results": results}


def run_opd_modes(args: argparse.Namespace) -> dict:
    """One SEED update of the seedfast leg per teacher-term form (loss.opd_mode), each in a fresh process from the
    same weights and step samples; time and peak memory against `gate` (the reference recipe has only `gate`)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="seedfast_peers_") as tmp:
        ckpt = write_checkpoint(model_config(args.shape, args.layers), Path(tmp) / "hf")
        for mode in args.opd_modes:
            row = {"opd_mode": mode, **run_leg(args, "seedfast", "seed", ckpt, Path(tmp) / f"{mode}.safetensors",
                                                mode)}
            print(f"  {args.shape} seed opd_mode={mode}: " + (row.get("error") or
                  f"{row['phases_s']['total']:.2f} s, +{row['peak_extra_bytes'] / 2**20:.0f} MiB"), file=sys.stderr)
            rows.append(row)
    base = next((r for r in rows if r["opd_mode"] == "gate" and "phases_s" in r), None)
    for r in rows:
        if base is not None and "phases_s" in r:
            r["time_vs_gate"] = r["phases_s"]["total"] / base["phases_s"]["total"]
            r["memory_vs_gate"] = r["peak_extra_bytes"] / max(base["peak_extra_bytes"], 1)
    table = [{"opd_mode": r["opd_mode"], "total_s": r.get("phases_s", {}).get("total"),
              "x_gate": r.get("time_vs_gate"), "teacher": r.get("phases_s", {}).get("teacher"),
              "fwd_bwd": r.get("phases_s", {}).get("fwd_bwd"),
              "peak_MiB": r["peak_extra_bytes"] / 2**20 if "peak_extra_bytes" in r else None,
              "mem_x_gate": r.get("memory_vs_gate"), "loss": r.get("loss"), "note": r.get("error")} for r in rows]
    print_table(table, list(table[0]), title=f"one SEED update per loss.opd_mode, seedfast, shape {args.shape}")
    return {"algo": "seed", "leg": "seedfast", "opd_modes": rows}


def print_rows(shape: str, results: dict) -> None:
    table = []
    for algo, rows in results.items():
        for r in rows:
            ph, conf = r.get("phases_s", {}), r.get("conformance", {})
            table.append({"algo": algo, "leg": r["leg"], "total_s": ph.get("total"),
                          "x_ref": r.get("time_vs_reference"),
                          "old": ph.get("old"), "ref": ph.get("ref"), "teacher": ph.get("teacher"),
                          "fwd_bwd": ph.get("fwd_bwd"), "optim": ph.get("optimizer"),
                          "peak_MiB": r["peak_extra_bytes"] / 2**20 if "peak_extra_bytes" in r else None,
                          "mem_x_ref": r.get("memory_vs_reference"), "loss_diff": r.get("loss_abs_diff"),
                          "grad_diff": conf.get("grad_max_abs_diff"), "w_diff": conf.get("weight_max_abs_diff"),
                          "note": r.get("error")})
    print_table(table, list(table[0]), title=f"one RL update, shape {shape} (seconds; memory above the pre-update "
                                              "level; diffs vs the reference's first update)")


def save(args: argparse.Namespace, shape_result: dict) -> Path:
    """Merge this shape into the JSON file (other shapes kept) and write it atomically."""
    path = Path(args.out) if args.out else RESULTS_DIR / f"peers_{args.device}.json"
    record = json.loads(path.read_text()) if path.exists() else {"benchmark": "peers", "shapes": {}}
    cfg = model_config(args.shape, args.layers)
    batch = SHAPES[args.shape]["batch"]
    # each entry carries its own machine, versions and commit: entries of one file may come from different boxes
    run = dict(machine=machine_info(), versions=versions("torch", "transformers", "liger-kernel", "seedfast"),
               git_commit=git_commit())
    record.update(**run, hyper_params=hyper_params())
    record["shapes"][result_key(args)] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **run,
        "command": command_line(),
        "model": cfg, "layers_reduced_from": SHAPES[args.shape]["model"]["num_hidden_layers"] if args.layers else None,
        "batch": batch, "samples": batch["tasks"] * batch["trajectories"], "insertion": args.insertion,
        "device": args.device, "dtype": args.dtype, "reps": args.reps, "threads": args.threads,
        "activation_checkpointing": args.checkpointing, **shape_result,
    }
    return write_json_atomic(path, record)


def result_key(args: argparse.Namespace) -> str:
    """The JSON entry of a run: the shape, its cut depth, and whether activations were checkpointed."""
    full = SHAPES[args.shape]["model"]["num_hidden_layers"]
    cut = f"_{args.layers}layers" if args.layers and args.layers != full else ""
    return args.shape + cut + ("_ckpt" if args.checkpointing else "") + ("_opd_modes" if args.opd_modes else "")


# ----------------------------------------------------------------------------------------- docs/performance.md

# The entries of results/peers_cpu.json in "Side by side with the reference recipe": every leg and algorithm at two
# shapes, then one SEED update at full depth without and with activation checkpointing; each shape's name there.
SIDE_BY_SIDE = ("tiny", "qwen0.5b_2layers")
FULL_DEPTH = ("qwen0.5b", "qwen0.5b_ckpt")
DOC_NAMES = {"tiny": "tiny: demo model", "qwen0.5b": "Qwen2.5-0.5B shape"}


def _leg(entry: dict, algo: str, leg: str) -> dict:
    return next(r for r in entry["results"][algo] if r["leg"] == leg)


def _count(n: int) -> str:
    return f"{n:,}" if n >= 10_000 else str(n)  # 1500, 151,936


def _ratio(x: float, bold: bool) -> str:
    return f"**{x:.2f}×**" if bold else f"{x:.2f}×"


def _time_cell(entry: dict) -> str:
    """SEED's time against the reference's (in bold, the headline): the ratio, then both seconds, to three
    significant figures of the larger."""
    seedfast = _leg(entry, "seed", "seedfast")
    ours, ref = (_leg(entry, "seed", leg)["phases_s"]["total"] for leg in ("seedfast", "reference"))
    digits = max(0, 2 - math.floor(math.log10(max(ours, ref))))
    return f"{_ratio(seedfast['time_vs_reference'], True)} ({ours:.{digits}f} s vs {ref:.{digits}f} s)"


def _memory_cell(entry: dict) -> str:
    """SEED's peak memory against the reference's, in bold at half or less: the ratio, then both peaks, in MiB where
    the reference's is under 1 GiB, else in GiB."""
    ratio = _leg(entry, "seed", "seedfast")["memory_vs_reference"]
    ours, ref = (_leg(entry, "seed", leg)["peak_extra_bytes"] for leg in ("seedfast", "reference"))
    unit, fmt = ("MiB", ".0f") if ref < 2**30 else ("GiB", ".1f")
    scale = 2**20 if unit == "MiB" else 2**30
    return f"{_ratio(ratio, ratio <= 0.5)} ({ours / scale:{fmt}} vs {ref / scale:{fmt}} {unit})"


def _where(entries: list[dict]) -> str:
    """'CPU, fp32': the device and dtype the entries share."""
    kinds = {(e["device"].upper(), e["dtype"]) for e in entries}
    if len(kinds) != 1:
        raise ValueError(f"peers: one table's entries ran on different devices or dtypes: {sorted(kinds)}")
    return ", ".join(kinds.pop())


def side_by_side_table(data: dict) -> str:
    """The table of SEED and GRPO against the reference (and Liger's SEED) in docs/performance.md, 'Side by side with
    the reference recipe', from the SIDE_BY_SIDE entries of results/peers_cpu.json (make docs)."""
    entries = [data["shapes"][key] for key in SIDE_BY_SIDE]
    lines = [f"| shape ({_where(entries)}) | SEED time | SEED peak memory | GRPO time | GRPO peak memory | "
             "Liger, SEED time / memory |", "|---|---|---|---|---|---|"]
    for key, e in zip(SIDE_BY_SIDE, entries):
        m, b = e["model"], e["batch"]
        cut = e.get("layers_reduced_from")
        shape = DOC_NAMES[key.split("_")[0]] + (f" **cut to {m['num_hidden_layers']} of {cut} layers**" if cut else "")
        arch = [f"d {m['hidden_size']}", *([] if cut else [f"{m['num_hidden_layers']} layers"]),
                f"V {_count(m['vocab_size'])}", *(["tied"] if m.get("tie_word_embeddings") else [])]
        label = (f"{shape} ({', '.join(arch)}), {e['samples']} samples, prompts ~{b['prompt']}, skill {b['skill']}, "
                 f"response {b['response']}")
        grpo, liger = _leg(e, "grpo", "seedfast"), _leg(e, "seed", "liger")
        lines.append(f"| {label} | {_time_cell(e)} | {_memory_cell(e)} | {_ratio(grpo['time_vs_reference'], True)} | "
                     f"{_ratio(grpo['memory_vs_reference'], grpo['memory_vs_reference'] <= 0.5)} | "
                     f"{_ratio(liger['time_vs_reference'], False)} / {_ratio(liger['memory_vs_reference'], False)} |")
    return "\n".join(lines)


def full_depth_table(data: dict) -> str:
    """The same section's table of one SEED update at full depth, without and with activation checkpointing, from
    the FULL_DEPTH entries of results/peers_cpu.json (make docs)."""
    entries = [data["shapes"][key] for key in FULL_DEPTH]
    shapes = {(key.split("_")[0], e["model"]["num_hidden_layers"]) for key, e in zip(FULL_DEPTH, entries)}
    if len(shapes) != 1:
        raise ValueError(f"peers: the full-depth entries {FULL_DEPTH} are not one shape: {sorted(shapes)}")
    shape, layers = shapes.pop()
    lines = [f"| {DOC_NAMES[shape]}, {layers} layers, one SEED update ({_where(entries)}) | time | peak memory |",
             "|---|---|---|"]
    for e in entries:
        label = ("with activation checkpointing on both sides (`--checkpointing`)" if e["activation_checkpointing"]
                 else "without activation checkpointing")
        lines.append(f"| {label} | {_time_cell(e)} | {_memory_cell(e)} |")
    return "\n".join(lines)


OPD_MODES_ENTRY = "qwen0.5b_2layers_opd_modes"


def opd_modes_table(data: dict) -> str:
    """One SEED update of seedfast per loss.opd_mode against `gate` (docs/performance.md, 'Full-vocabulary
    divergences without logits'), from the OPD_MODES_ENTRY of results/peers_cpu.json (make docs)."""
    e = data["shapes"][OPD_MODES_ENTRY]
    m = e["model"]
    shape = f"{DOC_NAMES['qwen0.5b']} cut to {m['num_hidden_layers']} layers"
    lines = [f"| one SEED update, {shape} (d {m['hidden_size']}, V {_count(m['vocab_size'])}), {e['samples']} "
             f"samples, {_where([e])} | time | vs gate | peak memory | vs gate |", "|---|---|---|---|---|"]
    for r in e["opd_modes"]:
        if "phases_s" not in r:
            lines.append(f"| `loss.opd_mode={r['opd_mode']}` | – | – | – | {r['error']} |")
            continue
        lines.append(f"| `loss.opd_mode={r['opd_mode']}` | {r['phases_s']['total']:.1f} s | {r['time_vs_gate']:.2f}× | "
                     f"{r['peak_extra_bytes'] / 2**30:.2f} GiB | {r['memory_vs_gate']:.2f}× |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=list(SHAPES), default="tiny")
    ap.add_argument("--layers", type=int, help="cut the model to this many layers (hidden size and vocab kept)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="bf16: GPU only; no 1e-4 check then")
    ap.add_argument("--algos", nargs="+", choices=ALGOS, default=list(ALGOS))
    ap.add_argument("--legs", nargs="+", choices=LEGS, default=list(LEGS))
    ap.add_argument("--insertion", choices=("before_response", "after_task", "prepend"), default="before_response")
    ap.add_argument("--reps", type=int, help="timed updates after the first (default: per shape; 0 = time the first)")
    ap.add_argument("--threads", type=int, help="torch threads per process (default: torch's)")
    ap.add_argument("--checkpointing", action="store_true",
                    help="activation checkpointing on every leg's policy (recompute each layer in backward)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per process")
    ap.add_argument("--out", help="JSON path (default benchmarks/results/peers_<device>.json; shapes are merged)")
    ap.add_argument("--opd-modes", nargs="+", choices=OPD_MODES, help="instead of the legs: one SEED update of "
                    "seedfast per loss.opd_mode (gate first: the ratios' baseline), entry <shape>..._opd_modes")
    ap.add_argument("--opd-mode", choices=OPD_MODES, default="gate", help=argparse.SUPPRESS)
    ap.add_argument("--worker", nargs=2, metavar=("LEG", "ALGO"), help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", help=argparse.SUPPRESS)
    ap.add_argument("--dump", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.reps is None:
        args.reps = SHAPES[args.shape]["reps"]
    return args


def main() -> None:
    args = parse_args()
    if args.worker:
        args.leg, args.algo = args.worker
        print(json.dumps(worker(args)))
        return
    if args.opd_modes:
        if args.opd_modes[0] != "gate":
            sys.exit("peers.py: --opd-modes starts with gate, the baseline of its ratios")
        start = time.perf_counter()
        result = run_opd_modes(args)
        path = save(args, result)
        print(f"wrote {path} in {time.perf_counter() - start:.0f} s")
        return
    if "reference" not in args.legs:
        sys.exit("peers.py: the reference leg is the baseline of every ratio and check; keep it in --legs")
    start = time.perf_counter()
    path = save_and_report(args)
    print(f"wrote {path} in {time.perf_counter() - start:.0f} s")


def save_and_report(args: argparse.Namespace) -> Path:
    result = run_shape(args)
    print_rows(args.shape, result["results"])
    return save(args, result)


if __name__ == "__main__":
    main()
