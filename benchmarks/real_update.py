"""One SmolLM2-135M update on this CPU by phase, full fine-tuning vs LoRA, each phase beside its floor.

    python -m benchmarks.real_update                 # table + benchmarks/results/real_update.json
    python -m benchmarks.real_update --reps 1 --lora-rank 16

The recipe is configs/smollm2-135m_textworld_cpu.yaml (SEED, the policy as its own analyzer, 2 games x 4
trajectories, two mini-batches), on SmolLM2-135M-Instruct as fetched (`seedfast models fetch smollm2-135m`). One
rollout is made and handed to every variant, each starting from the same weights (benchmarks/step.py's method):
    full-grpo, full-seed       every weight trained (fp32 masters)
    lora-grpo, lora-seed       model.lora at the recipe's rank, the base frozen (on CPU in fp32 each adapted layer
                               trains with its merged weight, model/lora.py _MergedLoRA)
    lora-grpo-unmerged         lora-grpo with the adapters' own products instead: the ablation of the merged weight
The teacher's branches ride in the same packed forward as the student's, so no call times them alone: after each
SEED variant's update the benchmark runs its scoring pass again on the same samples, with and without their skills,
back to back, and the teacher's scoring is the difference (median of 3; its floor is SEED's scoring floor minus
GRPO's). The LoRA / full update ratios are medians of per-rep ratios (paired: the same rollout); the variants run in
a rotated order each rep.

A phase's floor is what the GEMMs inside it take on this box, measured in the same run (fp32, the recipe's threads):
    packed forward  its FLOPs over the rate of torch.mm at M = 4096 packed tokens: 2·(block linear parameters) per
                    token through the stack + 2·d·V per row the LM head scores + 4·layers·d_attn·(context) per
                    token of causal attention
    decode step     the time of that step's own GEMMs: F.linear of every block weight and the LM head of the model
                    at the step's rows, the weights read from memory as a step reads them (at a few rows a step is
                    bound by streaming 0.4 GB of weights, not by FLOPs: a rate measured on one cache-resident weight
                    would put the floor below what the hardware can do); a LoRA policy generates with its merged
                    weights (model/lora.py adapters_merged), so its floor is the base's
    update          full: 3x forward (activations, input and weight gradients; the head too); LoRA: 2x forward
                    (no weight gradient of a frozen weight) + the adapters' own FLOPs
The tokens each phase pushes through the model are counted by wrapping the policy's forward, prefill and decode, and
the head's rows by wrapping the fused ops, while the phase runs; nothing is estimated from the config.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import ROOT, machine_info, median, print_table, write_results
from seedfast.config import load_config
from seedfast.context.sample import StepSample
from seedfast.envs.textworld_games import make_games
from seedfast.model.lora import LoRALinear, adapters_merged, lora_modules
from seedfast.runtime.profiling import PhaseTimer
from seedfast.train.draws import seed_everything
from seedfast.train.rl import Trainer

RECIPE = ROOT / "configs" / "smollm2-135m_textworld_cpu.yaml"
MODEL = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
PHASES = ("rollout", "analyze", "score", "advantage", "update", "sync")
UNMERGED = "lora-grpo-unmerged"  # LoRA's GRPO update without the merged weight: the ablation of that one change


class Counter:
    """Tokens through the decoder stack, attention context, and LM-head rows, per phase (the timer's current one)."""

    def __init__(self) -> None:
        self.phase = "other"
        self.tokens: dict[str, float] = {}
        self.decode_rows: dict[str, float] = {}
        self.attn: dict[str, float] = {}  # Σ over query tokens of the keys each attends to
        self.head_rows: dict[str, float] = {}
        self.decode_steps: dict[str, list[int]] = {}  # the rows of each decode step
        self.decode_attn: dict[str, float] = {}

    def add(self, table: dict[str, float], value: float) -> None:
        table[self.phase] = table.get(self.phase, 0.0) + float(value)


@contextlib.contextmanager
def counted(policy: torch.nn.Module, counter: Counter) -> Iterator[None]:
    """Wrap the policy's forward / prefill / decode and the fused ops' entry points to count what they compute."""
    # by module name: the package seedfast.scoring exports a function `score` that hides its submodule's name
    score_mod, teacher_mod, update_mod = (importlib.import_module(f"seedfast.{name}") for name in (
        "scoring.score", "scoring.prefix_kv_teacher", "train.update"))

    def on_forward(_module, args, kwargs) -> None:
        ids = args[0] if args else kwargs["input_ids"]
        cu = args[1] if len(args) > 1 else kwargs.get("cu_seqlens")
        counter.add(counter.tokens, ids.numel())
        if cu is not None:  # causal attention within each sequence (a shared past's keys are left out: a floor)
            lengths = (cu[1:] - cu[:-1]).double()
            counter.add(counter.attn, float((lengths * (lengths + 1) / 2).sum()))

    def on_decode(ids: torch.Tensor, cache) -> None:
        counter.add(counter.tokens, ids.numel())
        counter.add(counter.decode_rows, ids.numel())
        counter.add(counter.head_rows, ids.numel())  # each row's next-token distribution
        counter.add(counter.decode_attn, float(cache.lengths.double().sum()))
        counter.decode_steps.setdefault(counter.phase, []).append(ids.numel())

    handles = [policy.register_forward_pre_hook(on_forward, with_kwargs=True)]
    original_decode, original_prefill = policy.decode, policy.prefill

    def decode(ids, cache):
        on_decode(ids, cache)
        return original_decode(ids, cache)

    def prefill(ids, cu, *args, **kwargs):
        counter.add(counter.head_rows, cu.numel() - 1)  # each prompt's first sampled token
        return original_prefill(ids, cu, *args, **kwargs)

    policy.decode, policy.prefill = decode, prefill

    patched = []

    def wrap(module, name: str) -> None:
        fn = getattr(module, name)

        def counting(hidden, *args, **kwargs):
            teacher = kwargs.get("teacher_hidden")  # linear_logprob scores the teacher's rows in the same pass
            counter.add(counter.head_rows, hidden.shape[0] + (0 if teacher is None else teacher.shape[0]))
            return fn(hidden, *args, **kwargs)

        setattr(module, name, counting)
        patched.append((module, name, fn))

    for module in (score_mod, teacher_mod, update_mod):
        for name in ("linear_logprob", "fused_loss", "fused_divergence"):
            if hasattr(module, name):
                wrap(module, name)
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        del policy.decode, policy.prefill
        for module, name, fn in patched:
            setattr(module, name, fn)


class CountingTimer(PhaseTimer):
    def __init__(self, counter: Counter) -> None:
        super().__init__()
        self.counter = counter

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        before = self.counter.phase
        self.counter.phase = name
        try:
            with super().phase(name):
                yield
        finally:
            self.counter.phase = before


@contextlib.contextmanager
def adapters_unmerged(on: bool) -> Iterator[None]:
    """The ablation of LoRA's merged-weight training (model/lora.py _MergedLoRA): within the block every adapted layer
    trains with the adapters' own products, as a bf16 or GPU layer does."""
    if not on:
        yield
        return
    merged = LoRALinear._trains_merged
    LoRALinear._trains_merged = lambda self, x: False
    try:
        yield
    finally:
        LoRALinear._trains_merged = merged


@contextlib.contextmanager
def scoring_captured() -> Iterator[list[tuple[list, dict]]]:
    """The scoring pass's calls (samples, keyword arguments) while the block runs (train/rl.py's `score`)."""
    rl = importlib.import_module("seedfast.train.rl")
    inner, calls = rl.score, []

    def capturing(model, samples, **kwargs):
        calls.append((samples, kwargs))
        return inner(model, samples, **kwargs)

    rl.score = capturing
    try:
        yield calls
    finally:
        rl.score = inner


def teacher_seconds(policy: torch.nn.Module, calls: list[tuple[list, dict]], reps: int = 3) -> float:
    """The teacher's part of a SEED scoring pass, measured whole: the pass on its samples against the same pass on
    the same samples stripped of their skills (no teacher branch), back to back as train/rl.py runs it (merged LoRA
    weights), the median over `reps` of the difference: seconds apart, where SEED's scoring phase minus GRPO's is
    minutes apart and carries both phases' noise."""
    score = importlib.import_module("seedfast.train.rl").score
    stripped = [[StepSample(prompt_ids=s.prompt_ids, response_ids=s.response_ids, sample_id=s.sample_id,
                            reward=s.reward, penalty=s.penalty, group_id=s.group_id) for s in samples]
                for samples, _ in calls]
    differences = []
    with torch.no_grad(), adapters_merged(policy):
        for _ in range(reps):
            took = []
            for batches in ([c[0] for c in calls], stripped):
                t = time.perf_counter()
                for samples, (_, kwargs) in zip(batches, calls):
                    score(policy, samples, **kwargs)
                took.append(time.perf_counter() - t)
            differences.append(took[0] - took[1])
    return median(differences)


def gemm_rate(m: int, k: int, n: int, reps: int = 5) -> float:
    """FLOP/s of fp32 torch.mm [m, k] x [k, n] on this box, best of `reps` after a warm-up."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * m * k * n / best


def decode_step_seconds(policy: torch.nn.Module, rows: int, reps: int = 5) -> float:
    """The GEMMs of one decode step at `rows` rows: F.linear of each block weight (the adapted layers' base weights:
    generation merges the adapters into them) and the LM head, best of `reps` after a warm-up."""
    weights = [m.weight for name, m in policy.named_modules()
               if isinstance(m, torch.nn.Linear) and ".layers." in f".{name}"] + [policy.lm_head_weight]
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=w.dtype) for w in weights}
    best = float("inf")
    with torch.inference_mode():
        for rep in range(reps + 1):
            t = time.perf_counter()
            for w in weights:
                F.linear(inputs[w.shape[1]], w)
            if rep:
                best = min(best, time.perf_counter() - t)
    return best


def model_shape(policy: torch.nn.Module) -> dict[str, float]:
    c = policy.config
    blocks = sum(m.weight.numel() for name, m in policy.named_modules()
                 if isinstance(m, torch.nn.Linear) and ".layers." in f".{name}")
    adapters = sum(m.lora_A.numel() + m.lora_B.numel() for m in lora_modules(policy).values())
    return {"block_linear_params": blocks, "adapter_params": adapters, "d": c.hidden_size, "vocab": c.vocab_size,
            "layers": c.num_hidden_layers, "d_attn": c.num_attention_heads * c.head_dim,
            "intermediate": c.intermediate_size}


def phase_flops(shape: dict[str, float], counter: Counter, phase: str, training: str | None) -> tuple[float, float]:
    """(the FLOPs of the phase's packed forwards (and backward, `training` 'full' / 'lora' for the update), the FLOPs
    of its decode steps), from what was counted (module docstring)."""
    decoded = counter.decode_rows.get(phase, 0.0)
    tokens = counter.tokens.get(phase, 0.0) - decoded
    rows = counter.head_rows.get(phase, 0.0) - decoded
    forward = (2 * shape["block_linear_params"] * tokens + 2 * shape["d"] * shape["vocab"] * rows
               + 4 * shape["layers"] * shape["d_attn"] * counter.attn.get(phase, 0.0))
    decode = (2 * (shape["block_linear_params"] + shape["d"] * shape["vocab"]) * decoded
              + 4 * shape["layers"] * shape["d_attn"] * counter.decode_attn.get(phase, 0.0))
    if training == "full":
        return 3 * forward, 0.0
    if training == "lora":
        return 2 * forward + 6 * shape["adapter_params"] * tokens, 0.0
    return forward + 2 * shape["adapter_params"] * tokens, decode


def paired_median(a: list[float], b: list[float], pair) -> float:
    """The median over reps of pair(a[rep], b[rep])."""
    return median([pair(x, y) for x, y in zip(a, b)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--lora-alpha", type=float, default=32.0)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--games-dir", default=str(Path(tempfile.gettempdir()) / "seedfast_real_update_games"))
    args = ap.parse_args()
    if not (MODEL / "config.json").is_file():
        raise SystemExit(f"{MODEL} is missing: run `seedfast models fetch smollm2-135m` first")
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="seedfast_real_update_"))
    base = [f"model.path={MODEL}", f"env.games_dir={args.games_dir}", f"run.out_dir={work}", "trainer.eval_every=0",
            "log.tensorboard=false", "log.progress=false", "env.workers=1"]
    cfg0 = load_config(RECIPE, base)
    env = cfg0.env
    make_games(args.games_dir, env.game_type, env.levels, env.n_train, env.n_eval, seed=0, workers=1)
    lora = [f"model.lora.rank={args.lora_rank}", f"model.lora.alpha={args.lora_alpha}"]
    variants = {"full-grpo": ["algorithm=grpo"], "full-seed": ["algorithm=seed"],
                "lora-grpo": ["algorithm=grpo", *lora], "lora-seed": ["algorithm=seed", *lora],
                UNMERGED: ["algorithm=grpo", *lora]}
    seconds: dict[str, dict[str, list[float]]] = {v: {} for v in variants}
    teacher_s: dict[str, list[float]] = {}
    counts: dict[str, list[Counter]] = {v: [] for v in variants}  # per rep: each rep rolls out anew
    shapes: dict[str, dict[str, float]] = {}
    rollout_counters: list[Counter] = []
    for rep in range(args.reps):
        seed_everything(rep)
        roller = Trainer(load_config(RECIPE, [*base, "algorithm=grpo", "run.name=roll"]))
        rollout_counters.append(Counter())
        timer = CountingTimer(rollout_counters[-1])
        with counted(roller.policy, timer.counter):
            result = roller.rollout(rep, timer)
        rollout_s = timer.seconds["rollout"]
        floor_model = roller.policy  # the decode steps' GEMMs are timed on its weights
        roller.close()
        names = list(variants)
        for name in names[rep % len(names):] + names[:rep % len(names)]:  # each variant in each place in turn
            extra = variants[name]
            trainer = Trainer(load_config(RECIPE, [*base, *extra, f"run.name={name}"]))
            counter = Counter()
            timer = CountingTimer(counter)
            seed_everything(rep)
            with counted(trainer.policy, counter), adapters_unmerged(name == UNMERGED), \
                    scoring_captured() as scored:
                trainer.learn(rep, result, timer)
            if name.endswith("-seed"):  # outside the phases: the teacher's part of the scoring pass it just ran
                teacher_s.setdefault(name, []).append(teacher_seconds(trainer.policy, scored))
            shapes[name] = model_shape(trainer.policy)
            trainer.close()
            for k, v in {"rollout": rollout_s, **timer.seconds}.items():
                seconds[name].setdefault(k, []).append(v)
            counts[name].append(counter)
        print(f"rep {rep} done", flush=True)

    d, inter = int(shapes["full-grpo"]["d"]), int(shapes["full-grpo"]["intermediate"])
    rates = {"packed": gemm_rate(4096, d, inter)}
    all_counters = [*rollout_counters, *(c for cs in counts.values() for c in cs)]
    step_rows = sorted({r for c in all_counters for steps in c.decode_steps.values() for r in steps})
    step_floor = {r: decode_step_seconds(floor_model, r) for r in step_rows}

    def floor_of(name: str, phase: str, rep: int) -> tuple[float, float]:
        """(the phase's floor in seconds, its GFLOP) in rep `rep`: each rep's rollout is its own, so are its counts."""
        c = rollout_counters[rep] if phase == "rollout" else counts[name][rep]
        training = name.split("-")[0] if phase == "update" else None
        packed, decode = phase_flops(shapes[name], c, phase, training)
        return packed / rates["packed"] + sum(step_floor[r] for r in c.decode_steps.get(phase, [])), \
            (packed + decode) / 1e9

    rows = []
    for name in variants:
        for phase in PHASES:
            if phase not in seconds[name]:
                continue
            took = seconds[name][phase]
            floors = [floor_of(name, phase, rep)[0] for rep in range(len(took))]
            c = rollout_counters[0] if phase == "rollout" else counts[name][0]
            steps = c.decode_steps.get(phase, [])
            rows.append({"variant": name, "phase": phase, "seconds": round(median(took), 3),
                         "gflop": round(floor_of(name, phase, 0)[1], 2), "floor_s": round(median(floors), 3),
                         "vs_floor": round(median(rated), 2) if (rated := [t / f for t, f in zip(took, floors)
                                                                           if f > 0]) else None,
                         "tokens": int(c.tokens.get(phase, 0)), "head_rows": int(c.head_rows.get(phase, 0)),
                         "decode_steps": len(steps), "decode_rows": int(sum(steps))})
    print_table(rows, ["variant", "phase", "seconds", "floor_s", "vs_floor", "gflop", "tokens", "head_rows"],
                title=f"SmolLM2-135M update by phase on this CPU (median of {args.reps}, {args.threads} threads, "
                      "eager)")
    # paired within a rep (the same rollout, minutes apart) and then the median: the box's drift between reps
    # cancels, where a ratio or difference of two medians carries both sides' noise
    ratios = {f"lora_update_vs_full_{algo}": paired_median(seconds[f"lora-{algo}"]["update"],
                                                            seconds[f"full-{algo}"]["update"], lambda a, b: a / b)
              for algo in ("grpo", "seed")}
    ratios["lora_merged_vs_unmerged_grpo"] = paired_median(seconds["lora-grpo"]["update"], seconds[UNMERGED]["update"],
                                                           lambda a, b: a / b)
    ratios_by_rep = {"lora_update_vs_full_grpo": [a / b for a, b in zip(seconds["lora-grpo"]["update"],
                                                                        seconds["full-grpo"]["update"])],
                     "lora_update_vs_full_seed": [a / b for a, b in zip(seconds["lora-seed"]["update"],
                                                                        seconds["full-seed"]["update"])],
                     "lora_merged_vs_unmerged_grpo": [a / b for a, b in zip(seconds["lora-grpo"]["update"],
                                                                            seconds[UNMERGED]["update"])]}
    teacher = {}
    for name in ("full", "lora"):
        took = teacher_s[f"{name}-seed"]
        floors = [floor_of(f"{name}-seed", "score", rep)[0] - floor_of(f"{name}-grpo", "score", rep)[0]
                  for rep in range(len(took))]
        rated = [t / f for t, f in zip(took, floors) if f > 0]  # a rep whose skills all failed has no teacher
        teacher[name] = {"seconds": round(median(took), 3), "floor_s": round(median(floors), 3),
                         "vs_floor": round(median(rated), 2) if rated else None, "reps_with_a_teacher": len(rated)}
    print({k: round(v, 3) for k, v in ratios.items()}, "teacher scoring (measured whole):", teacher)
    write_results("real_update", {
        "machine": machine_info(),
        "recipe": str(RECIPE.relative_to(ROOT)),
        "settings": {"threads": args.threads, "mode": "eager", "reps": args.reps, "lora_rank": args.lora_rank,
                     "lora_alpha": args.lora_alpha, "dtype": cfg0.model.dtype},
        "shapes": {"model": shapes, "step_records": len(result.steps), "trajectories": len(result.trajectories)},
        "gemm_flops_per_s": rates,
        "decode_step_floor_s": {str(r): v for r, v in step_floor.items()},
        "rows": rows,
        "seconds_by_rep": seconds,
        "teacher_scoring_by_rep": teacher_s,
        "ratios": ratios,
        "ratios_by_rep": ratios_by_rep,
        "teacher_scoring": teacher,
        "goal": "every phase within 2x of its floor; the LoRA update <= 0.7x the full update (issue #53)",
    })


if __name__ == "__main__":
    main()


def docs_table(result: dict) -> str:
    """The table of docs/performance.md (make docs): SEED's update by phase, full vs LoRA, each beside its floor; the
    scoring pass split into old-policy scoring (GRPO's) and the teacher's (measured whole: `teacher_seconds`)."""
    rows = {(r["variant"], r["phase"]): r for r in result["rows"]}

    def cell(variant: str, phase: str) -> tuple[float, float, float | None]:
        """(median seconds, median floor, median over reps of seconds / floor)."""
        if phase == "teacher scoring":
            teacher = result["teacher_scoring"][variant]
            return teacher["seconds"], teacher["floor_s"], teacher["vs_floor"]
        name, key = (f"{variant}-grpo", "score") if phase == "old-policy scoring" else (f"{variant}-seed", phase)
        r = rows.get((name, key))
        return (r["seconds"], r["floor_s"], r["vs_floor"]) if r else (0.0, 0.0, None)

    def ratio(vs_floor: float | None) -> str:
        return f"{vs_floor:.1f}x" if vs_floor is not None else "—"

    lines = ["| phase | full: s | floor s | vs floor | LoRA: s | floor s | vs floor |", "|---|---|---|---|---|---|---|"]
    for phase in ("rollout", "analyze", "old-policy scoring", "teacher scoring", "update", "sync"):
        full, lora = cell("full", phase), cell("lora", phase)
        if phase == "rollout":  # one rollout, made by the full model, is handed to every variant
            lines.append(f"| {phase} | {full[0]:.2f} | {full[1]:.2f} | {ratio(full[2])} | (the full model's) | "
                         f"{lora[1]:.2f} | — |")
            continue
        lines.append(f"| {phase} | {full[0]:.2f} | {full[1]:.2f} | {ratio(full[2])} | {lora[0]:.2f} | {lora[1]:.2f} | "
                     f"{ratio(lora[2])} |")
    m, s = result["machine"], result["settings"]
    lines.append("")
    lines.append(f"LoRA (r {s['lora_rank']}, alpha {s['lora_alpha']:g}) update / full update: "
                 f"{result['ratios']['lora_update_vs_full_seed']:.2f} (SEED), "
                 f"{result['ratios']['lora_update_vs_full_grpo']:.2f} (GRPO); per rep "
                 f"{_spread(result['ratios_by_rep']['lora_update_vs_full_seed'])} (SEED), "
                 f"{_spread(result['ratios_by_rep']['lora_update_vs_full_grpo'])} (GRPO). LoRA's GRPO update with "
                 f"the merged weight / with the adapters' own products: "
                 f"{result['ratios']['lora_merged_vs_unmerged_grpo']:.2f} (per rep "
                 f"{_spread(result['ratios_by_rep']['lora_merged_vs_unmerged_grpo'])}). "
                 f"{m['cpu']}, {s['threads']} threads, "
                 f"{s['mode']}, {s['dtype']}, median of {s['reps']} reps, each rolled out anew (the ratios, to "
                 "the floor too, paired by rep); "
                 "GEMM rate measured in the same run: "
                 f"{result['gemm_flops_per_s']['packed'] / 1e9:.0f} GFLOP/s packed; a decode step's GEMMs "
                 f"{1e3 * result['decode_step_floor_s'][max(result['decode_step_floor_s'], key=int)]:.0f} ms at "
                 f"{max(result['decode_step_floor_s'], key=int)} rows "
                 "(`benchmarks/results/real_update.json`).")
    return "\n".join(lines)


def _spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"
