"""The rollout engine chosen by measurement: the own engine (seedfast/rollout/own_engine.py, Sampler) against vLLM's
CPU build, on SmolLM2-135M-Instruct with the prompts of its recipe (configs/smollm2-135m_textworld_cpu.yaml).

    .venv/bin/python -m benchmarks.rollout                  # the full measurement (the lead runs it on a quiet box)
    .venv/bin/python -m benchmarks.rollout --batches 2 --new-tokens 4 --reps 1 --dtypes fp32 --vllm-modes eager \\
        --step-updates 0 --name rollout_smoke               # a smoke run: does every part work

Prompts: the recipe's first-step TextWorld prompts, built by the rollout itself (run_agent_loop over the recipe's
task pool, one turn, through an engine that only records what it is asked), in groups of rollout.n copies as a
rollout's first generate call sends them: batch 8 is the recipe's batch (2 tasks x 4), 32 and 64 hold 8 and 16
tasks. Every call samples at the recipe's temperature without stop ids, so every sequence generates exactly
--new-tokens tokens (the recipe's max_response_tokens by default) in either engine.

Per engine, dtype and batch (medians of --reps calls, each engine in a fresh process: the own engine under .venv,
vLLM under .venv-vllm, their own torch builds):
  ttft_s           a call of one new token: prefill and the first token of every sequence
  seconds          a call of --new-tokens tokens
  tokens_per_s     generated tokens / seconds (prefill included: what a rollout's generate call delivers)
  decode_tok_s     (tokens - batch) / (seconds - ttft_s): the decode steps alone
vLLM's prefix cache is reset before each call (the RL loop resets it after every weight push, so a rollout never
finds its prompts cached); copies of a prompt within a call share it as they do in a rollout. vLLM runs eager
(rollout.vllm_enforce_eager=true) and compiled (torch.compile, vLLM's default); its start (engine built, compiled)
and a full weight push of the policy (what every RL step pays before its rollout) are timed too.

The RL step (--step-updates N > 0): N updates of the recipe (its algorithm, SEED) through the real Trainer with each
engine (fp32, the recipe's dtype; vLLM eager), from the instruct model, and each update's phase times from its
metrics.jsonl: the rollout's share of the update (time/rollout / time/step), and the share of everything the engine
does (rollout, the analyzer's generation, vLLM's weight sync). The first update is left out of the means (warm-up).

Writes benchmarks/results/<name>.json (machine, versions, shapes, rows) and prints the tables. --profile: only a
torch.profiler run of the own engine, written to the key "profile" of the same file (the measurement kept); a full
run keeps the file's profile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS_DIR,
    machine_info,
    print_table,
    results_record,
    update_json_atomic,
    write_json_atomic,
)

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
CONFIG = ROOT / "configs" / "smollm2-135m_textworld_cpu.yaml"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
NAME = "rollout"
# vLLM's CPU back end: its KV cache (GiB, it ignores the GPU memory share) and no thread pinning on a shared box
VLLM_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
STEP_PHASES = ("time/step", "time/sync", "time/rollout", "time/analyze")


# ------------------------------------------------------------------------------------------------ prompts


class _Recorder:
    """An engine that records the prompts it is asked to complete and answers each with a stop token."""

    def __init__(self, stop: int) -> None:
        self.stop = stop
        self.prompts: list[list[int]] = []

    def generate_full(self, prompts: Sequence[Sequence[int]], params: Any) -> list[Any]:
        from seedfast.rollout.engine import Generation

        self.prompts += [list(p) for p in prompts]
        return [Generation([self.stop], None, "stop") for _ in prompts]


def recipe_overrides(games_dir: Path) -> list[str]:
    """The recipe's config with paths made absolute (the benchmark runs from anywhere)."""
    return [f"model.path={MODEL}", f"env.games_dir={games_dir}"]


def recipe_prompts(games_dir: Path) -> dict[str, Any]:
    """The recipe's first-step prompts of its task pool, one per task, as the rollout builds them; the recipe's
    games (train and eval splits) are generated first when the folder lacks them (cached)."""
    from seedfast.config import load_config
    from seedfast.envs.textworld_games import make_games
    from seedfast.rollout.agent_loop import run_agent_loop, stop_token_ids
    from seedfast.runtime.setup import agent_config, load_run_tokenizer, load_tasks, make_env_slots
    from seedfast.train.draws import task_pool

    cfg = load_config(str(CONFIG), [*recipe_overrides(games_dir), "env.max_steps=1", "env.isolation=inline"],
                      command="train")
    env = cfg.env
    make_games(games_dir, env.game_type, env.levels, env.n_train, env.n_eval, seed=env.games_seed,
               workers=env.workers or 1)
    tokenizer = load_run_tokenizer(cfg, MODEL)
    tasks = task_pool(load_tasks(cfg, "train"), cfg.rollout.task_pool, cfg.run.seed)
    envs = make_env_slots(cfg, len(tasks))
    stops = stop_token_ids(tokenizer)
    recorder = _Recorder(stops[0])
    try:
        run_agent_loop(recorder, tokenizer, tasks, envs, agent_config(cfg, n=1, temperature=cfg.rollout.temperature))
    finally:
        close = getattr(envs, "close", None)
        if callable(close):
            close()
    return {"prompts": recorder.prompts, "group": cfg.rollout.n, "temperature": cfg.rollout.temperature,
            "top_p": cfg.rollout.top_p, "max_response_tokens": cfg.rollout.max_response_tokens,
            "games": [t.game_id for t in tasks]}


def batch_prompts(distinct: Sequence[Sequence[int]], group: int, batch: int) -> list[list[int]]:
    """`batch` prompts: the first batch/group distinct prompts, each repeated `group` times in a row (a rollout's
    first generate call); a batch smaller than a group holds copies of the first prompt."""
    if batch < group:
        return [list(distinct[0])] * batch
    if batch % group:
        raise ValueError(f"batch {batch} is not a multiple of the group size {group}")
    tasks = batch // group
    if tasks > len(distinct):
        raise ValueError(f"batch {batch} needs {tasks} distinct prompts, the recipe's pool has {len(distinct)}")
    return [list(p) for p in distinct[:tasks] for _ in range(group)]


# ------------------------------------------------------------------------------------------------ timing


def measure(generate: Callable[[list[list[int]], int, int], list[Any]], before_call: Callable[[], None],
            prompts: list[list[int]], new_tokens: int, reps: int) -> dict[str, Any]:
    """Medians over `reps` of a one-token call (ttft_s) and a `new_tokens` call (seconds) of `generate(prompts,
    max_new_tokens, seed)`, `before_call` run before each; after a warm-up call on the same prompts."""
    generate(prompts, 2, 0)  # the whole batch: a first call of a new batch size pays no one-time cost inside
    first, full, tokens = [], [], []
    for rep in range(reps):
        before_call()
        start = time.perf_counter()
        generate(prompts, 1, rep)
        first.append(time.perf_counter() - start)
        before_call()
        start = time.perf_counter()
        gens = generate(prompts, new_tokens, rep)
        full.append(time.perf_counter() - start)
        tokens.append(sum(len(g.token_ids) for g in gens))
    return row_of(len(prompts), len({tuple(p) for p in prompts}), sum(len(p) for p in prompts),
                  statistics.median(first), statistics.median(full), int(statistics.median(tokens)))


def row_of(batch: int, distinct: int, prompt_tokens: int, ttft_s: float, seconds: float, tokens: int
           ) -> dict[str, Any]:
    """One measurement's row: the times and the throughputs they give."""
    decode_s = seconds - ttft_s
    return {"batch": batch, "distinct_prompts": distinct, "prompt_tokens": prompt_tokens, "tokens": tokens,
            "ttft_s": round(ttft_s, 4), "seconds": round(seconds, 4), "tokens_per_s": round(tokens / seconds, 2),
            "decode_tok_s": round((tokens - batch) / decode_s, 2) if decode_s > 0 and tokens > batch else None}


def own_worker(data: dict[str, Any], dtype: str, batches: Sequence[int], new_tokens: int, reps: int,
               threads: int) -> dict[str, Any]:
    import torch

    from seedfast.model import load_hf
    from seedfast.rollout.own_engine import Sampler
    from seedfast.sampling_params import SamplingParams

    torch.set_num_threads(threads)
    start = time.perf_counter()
    model = load_hf(MODEL, dtype=getattr(torch, _torch_dtype(dtype)), attn_backend="sdpa").eval()
    sampler = Sampler(model, seed=0)
    start_s = time.perf_counter() - start

    def generate(prompts: list[list[int]], n: int, seed: int) -> list[Any]:
        return sampler.generate_full(prompts, SamplingParams(n, data["temperature"], data["top_p"], (), seed=seed))

    rows = [measure(generate, lambda: None, batch_prompts(data["prompts"], data["group"], b), new_tokens, reps)
            for b in batches]
    return {"start_s": round(start_s, 2), "threads": torch.get_num_threads(), "rows": rows}


def vllm_worker(data: dict[str, Any], dtype: str, batches: Sequence[int], new_tokens: int, reps: int,
                eager: bool) -> dict[str, Any]:
    import torch
    import vllm

    from seedfast.distributed.weight_push import buckets, hf_named_tensors
    from seedfast.model import load_hf
    from seedfast.rollout.vllm_engine import VLLMEngine
    from seedfast.sampling_params import SamplingParams

    longest = max(len(p) for p in data["prompts"]) + new_tokens
    start = time.perf_counter()
    engine = VLLMEngine(str(MODEL), dtype=dtype, seed=0, enforce_eager=eager, max_num_seqs=max(batches),
                        max_model_len=max(longest, 1024))
    start_s = time.perf_counter() - start
    try:
        def generate(prompts: list[list[int]], n: int, seed: int) -> list[Any]:
            return engine.generate_full(prompts, SamplingParams(n, data["temperature"], data["top_p"], (), seed=seed))

        rows = [measure(generate, engine.llm.reset_prefix_cache, batch_prompts(data["prompts"], data["group"], b),
                        new_tokens, reps) for b in batches]
        policy = load_hf(MODEL, dtype=torch.float32, attn_backend="sdpa")  # the trainer's fp32 weights
        pushes = [engine.push_weights(buckets(hf_named_tensors(policy, dtype=getattr(torch, _torch_dtype(dtype))),
                                              512 << 20))["seconds"] for _ in range(max(reps, 1))]
    finally:
        engine.close()
    return {"start_s": round(start_s, 2), "push_s": round(statistics.median(pushes), 3), "vllm": vllm.__version__,
            "torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows}


# the profile's categories: aten ops (self CPU time) by what they do
CATEGORIES = {"matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear"),
              "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention"),
              "sampling": ("aten::exponential_", "aten::multinomial", "aten::_log_softmax", "aten::argmax",
                           "aten::sort", "aten::cumsum")}


def categorize(self_us: dict[str, float]) -> dict[str, float]:
    """Shares of the total self CPU time by CATEGORIES, the rest as "other" (framework ops: norms, rotary,
    cache writes, indexing, the decode loop's bookkeeping)."""
    total = sum(self_us.values()) or 1.0
    shares = {c: sum(v for k, v in self_us.items() if k in names) / total for c, names in CATEGORIES.items()}
    shares["other"] = 1.0 - sum(shares.values())
    return {k: round(v, 4) for k, v in shares.items()}


def own_profile(data: dict[str, Any], dtype: str, batch: int, new_tokens: int, threads: int) -> dict[str, Any]:
    """torch.profiler over one own-engine call of one token (the prefill) and one of `new_tokens`: the self CPU
    time by category in each, and the decode steps' (the second less the first), with the top ops of the full
    call."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from seedfast.model import load_hf
    from seedfast.rollout.own_engine import Sampler
    from seedfast.sampling_params import SamplingParams

    torch.set_num_threads(threads)
    model = load_hf(MODEL, dtype=getattr(torch, _torch_dtype(dtype)), attn_backend="sdpa").eval()
    sampler = Sampler(model, seed=0)
    prompts = batch_prompts(data["prompts"], data["group"], batch)
    sampler.generate_full(prompts[:2], SamplingParams(2, data["temperature"]))
    calls = {}
    for name, n in (("prefill", 1), ("call", new_tokens)):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            sampler.generate_full(prompts, SamplingParams(n, data["temperature"], data["top_p"], (), seed=0))
        calls[name] = {e.key: float(e.self_cpu_time_total) for e in prof.key_averages()}
    decode = {k: max(v - calls["prefill"].get(k, 0.0), 0.0) for k, v in calls["call"].items()}
    top = sorted(calls["call"].items(), key=lambda kv: -kv[1])[:12]
    total = sum(calls["call"].values())
    return {"dtype": dtype, "batch": batch, "new_tokens": new_tokens, "threads": torch.get_num_threads(),
            "seconds_self": {k: round(sum(v.values()) / 1e6, 3) for k, v in {**calls, "decode": decode}.items()},
            "shares": {k: categorize(v) for k, v in {**calls, "decode": decode}.items()},
            "top_ops": [{"op": k, "share": round(v / total, 4)} for k, v in top]}


def _torch_dtype(dtype: str) -> str:
    return {"fp32": "float32", "bf16": "bfloat16"}[dtype]


# ------------------------------------------------------------------------------------------------ the RL step


def step_worker(engine: str, games_dir: Path, out: Path, updates: int, eager: bool = True) -> dict[str, Any]:
    """`updates` updates of the recipe with rollout.engine=`engine` (vLLM: eager or compiled); each update's phase
    times and engine metrics."""
    from seedfast.config import load_config
    from seedfast.train.rl import Trainer

    overrides = [*recipe_overrides(games_dir), f"run.out_dir={out}", f"run.name={engine}", f"rollout.engine={engine}",
                 f"trainer.steps={updates}", "trainer.checkpoint_every=0", "trainer.eval_games=1",
                 "log.progress=false", "log.tensorboard=false", f"rollout.vllm_enforce_eager={str(eager).lower()}",
                 "rollout.vllm_max_num_seqs=8", "rollout.vllm_max_model_len=2048"]
    cfg = load_config(str(CONFIG), overrides, command="train")
    trainer = Trainer(cfg, policy_dir=MODEL)
    try:
        trainer.run()
        rows = [json.loads(line) for line in trainer.paths.metrics.read_text().splitlines()]
    finally:
        trainer.close()
    keep = (*STEP_PHASES, "rollout/generated_tokens", "rollout/generate_calls", "rollout/steps")
    return {"overrides": overrides, "updates": [{k: row[k] for k in keep if k in row} for row in rows]}


def step_summary(updates: Sequence[dict[str, float]]) -> dict[str, float]:
    """Means over the updates after the first (all of them when there is one): each phase's seconds, the rollout's
    share of the update and the share of everything the engine does (sync, rollout, the analyzer's generation)."""
    rows = list(updates[1:] or updates)
    mean = {k: statistics.fmean(r.get(k, 0.0) for r in rows) for k in STEP_PHASES}
    engine_s = mean["time/sync"] + mean["time/rollout"] + mean["time/analyze"]
    return {**{k.split("/")[1] + "_s": round(v, 3) for k, v in mean.items()}, "updates_averaged": len(rows),
            "rollout_share": round(mean["time/rollout"] / mean["time/step"], 4),
            "engine_share": round(engine_s / mean["time/step"], 4)}


# ------------------------------------------------------------------------------------------------ the report


def compare(measurements: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Table rows: every measurement's rows with its engine and dtype, and each one's speed against the own engine
    at the same dtype and batch (own's seconds / this one's: above 1 = faster than own)."""
    own = {(m["dtype"], r["batch"]): r for m in measurements if m["engine"] == "own" for r in m["rows"]}
    out = []
    for m in measurements:
        for r in m["rows"]:
            base = own.get((m["dtype"], r["batch"]))
            out.append({"engine": m["engine"], "dtype": m["dtype"], **r,
                        "vs_own": round(base["seconds"] / r["seconds"], 3) if base else None,
                        "ttft_vs_own": round(base["ttft_s"] / r["ttft_s"], 3) if base else None})
    return out


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def markdown(data: dict[str, Any]) -> str:
    """The section of docs/performance.md ('Rollout engines, measured') from the JSON: the generation table, the
    engine starts and weight pushes, the RL step's shares, and which engine is faster at the recipe's batch."""
    rows = compare(data["measurements"])
    shapes = data["shapes"]
    lines = [
        f"SmolLM2-135M-Instruct on {data['machine'].get('cpu', '?')} ({data['machine'].get('cpu_count', '?')} cores, "
        f"{shapes['threads']} threads), the recipe's first-step prompts ({shapes['prompt_tokens_min']}-"
        f"{shapes['prompt_tokens_max']} tokens, groups of {shapes['group']}), {shapes['new_tokens']} new tokens at "
        f"temperature {shapes['temperature']}, medians of {shapes['reps']} calls; vLLM {data.get('vllm_version')} "
        f"(`benchmarks/results/{data['benchmark']}.json`, `python -m benchmarks.rollout`).",
        "",
        "| engine | dtype | batch | time to first token (s) | call (s) | tokens/s | decode tokens/s | "
        "speed vs own |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r["dtype"], r["batch"], r["engine"])):
        lines.append(f"| {r['engine']} | {r['dtype']} | {r['batch']} | {_fmt(r['ttft_s'])} | {_fmt(r['seconds'])} | "
                     f"{_fmt(r['tokens_per_s'])} | {_fmt(r['decode_tok_s'])} | {_fmt(r['vs_own'])}x |")
    lines += ["", "| engine | dtype | start (s) | weight push (s) |", "|---|---|---|---|"]
    for m in data["measurements"]:
        lines.append(f"| {m['engine']} | {m['dtype']} | {_fmt(m.get('start_s'))} | {_fmt(m.get('push_s'))} |")
    if data.get("steps"):
        lines += ["", "| engine (RL step, fp32) | update (s) | sync (s) | rollout (s) | analyze (s) | rollout share | "
                      "engine share |", "|---|---|---|---|---|---|---|"]
        for engine, s in data["steps"].items():
            lines.append(f"| {engine} | {_fmt(s['step_s'])} | {_fmt(s['sync_s'])} | {_fmt(s['rollout_s'])} | "
                         f"{_fmt(s['analyze_s'])} | {s['rollout_share']:.0%} | {s['engine_share']:.0%} |")
    lines += ["", " ".join(filter(None, (verdict(rows, shapes["recipe_batch"]), step_verdict(data.get("steps") or {}),
                                         vllm_leads(rows))))]
    return "\n".join(lines)


def step_verdict(steps: dict[str, dict[str, Any]]) -> str:
    """The RL update's time with each engine: what a recipe's `rollout.engine` is chosen by (generation is a part)."""
    if len(steps) < 2:
        return ""
    fastest = min(steps, key=lambda e: steps[e]["step_s"])
    return ("In the recipe's RL update (fp32, SEED: rollout, the analyzer's generation and, for vLLM, the weight "
            "push) " + ", ".join(f"{e} took {steps[e]['step_s']:.1f} s" for e in steps)
            + f": {fastest} is the recipe's engine.")


def vllm_leads(rows: Sequence[dict[str, Any]], margin: float = 1.1) -> str:
    """Where a vLLM mode generates more than `margin` times faster than the own engine (the batch and dtype)."""
    leads = sorted({(r["dtype"], r["batch"]) for r in rows
                    if r["engine"] != "own" and r.get("vs_own") and r["vs_own"] > margin})
    if not leads:
        return ""
    return (f"vLLM leads by more than {margin:.1f}x at " + ", ".join(f"{d} batch {b}" for d, b in leads)
            + ": larger batches and bf16, where its decode kernels pay.")


def verdict(rows: Sequence[dict[str, Any]], recipe_batch: int) -> str:
    """Which engine generates the recipe's batch in fp32 fastest, and by how much over the own engine."""
    at = [r for r in rows if r["dtype"] == "fp32" and r["batch"] == recipe_batch]
    if not at:
        return f"No fp32 measurement at the recipe's batch ({recipe_batch})."
    best = min(at, key=lambda r: r["seconds"])
    own = next((r for r in at if r["engine"] == "own"), None)
    if own is None or best is own:
        others = [r for r in at if r is not own]
        lead = min((r["seconds"] / own["seconds"] for r in others), default=None) if own else None
        return (f"At the recipe's batch ({recipe_batch}, fp32) the own engine is the fastest"
                + (f", {lead:.2f}x ahead of the next" if lead else "") + ".")
    return (f"At the recipe's batch ({recipe_batch}, fp32) {best['engine']} is the fastest, "
            f"{own['seconds'] / best['seconds']:.2f}x the own engine's speed.")


def profile_markdown(profile: dict[str, Any], name: str = NAME) -> str:
    """The profile's table (the key "profile" of results/<name>.json): each dtype's prefill and decode self CPU time
    by category."""
    lines = ["Where the own engine's time goes (`--profile`: torch.profiler over one call, self CPU time by "
             f"category, `profile` in `benchmarks/results/{name}.json`):", "",
             "| dtype | batch | part | matmul | attention | sampling | other |", "|---|---|---|---|---|---|---|"]
    for p in profile["profiles"]:
        for part in ("prefill", "decode"):
            s = p["shares"][part]
            lines.append(f"| {p['dtype']} | {p['batch']} | {part} | {s['matmul']:.0%} | {s['attention']:.0%} | "
                         f"{s['sampling']:.0%} | {s['other']:.0%} |")
    return "\n".join(lines)


def docs_section(data: dict[str, Any] | None) -> str:
    """docs/performance.md's generated block from results/rollout.json: the measurement (or that there is none yet)
    and the profile (its key "profile") when there is one."""
    measured = data is not None and "measurements" in data
    parts = [markdown(data) if measured else
             f"Not measured yet: `.venv/bin/python -m benchmarks.rollout` writes `benchmarks/results/{NAME}.json`."]
    if data is not None and data.get("profile") is not None:
        parts.append(profile_markdown(data["profile"], data.get("benchmark", NAME)))
    return "\n\n".join(parts)


def committed(name: str) -> dict[str, Any] | None:
    """results/<name>.json, or None when it is not there."""
    path = RESULTS_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


# ------------------------------------------------------------------------------------------------ running it


def run_python(python: Path | str, argv: Sequence[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """`python -m benchmarks.rollout argv...` in a fresh process; its last stdout line is its JSON answer."""
    proc = subprocess.run([str(python), "-m", __spec__.name, *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, **env})
    if proc.returncode != 0:
        raise RuntimeError(f"{python} {' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="8,32,64", help="sequences per generate call (comma-separated)")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--engines", default="own,vllm")
    p.add_argument("--vllm-modes", default="eager,compiled", help="vLLM eager (enforce_eager) and/or compiled")
    p.add_argument("--new-tokens", type=int, default=None, help="default: the recipe's max_response_tokens")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch / OpenMP threads of each engine")
    p.add_argument("--kv-gib", type=int, default=2, help="vLLM's CPU KV cache (VLLM_CPU_KVCACHE_SPACE)")
    p.add_argument("--step-updates", type=int, default=3, help="RL updates per engine for the step's shares; 0 = skip")
    p.add_argument("--games-dir", default=str(ROOT / "runs" / "smollm2-135m_textworld_cpu" / "games"),
                   help="the recipe's games (generated there when missing, as the demo does)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per worker process")
    p.add_argument("--name", default=NAME)
    p.add_argument("--profile", action="store_true",
                   help="only profile the own engine (torch.profiler) at the first of --batches, each of --dtypes; "
                        "writes the key \"profile\" of results/<name>.json (the rest kept)")
    p.add_argument("--worker", choices=("own", "vllm", "step", "profile"), help=argparse.SUPPRESS)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    p.add_argument("--dtype", help=argparse.SUPPRESS)
    p.add_argument("--eager", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def worker_main(args: argparse.Namespace) -> None:
    batches = [int(b) for b in args.batches.split(",")]
    if args.worker == "step":
        answer = step_worker(args.engine, Path(args.games_dir), Path(args.out), args.step_updates, bool(args.eager))
    else:
        data = json.loads(Path(args.data).read_text())
        if args.worker == "profile":
            answer = own_profile(data, args.dtype, batches[0], args.new_tokens, args.threads)
        elif args.worker == "own":
            answer = own_worker(data, args.dtype, batches, args.new_tokens, args.reps, args.threads)
        else:
            answer = vllm_worker(data, args.dtype, batches, args.new_tokens, args.reps, bool(args.eager))
    print(json.dumps(answer))


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args)
    if not (MODEL / "config.json").exists():
        sys.exit(f"no cached model at {MODEL}: .venv/bin/seedfast models fetch smollm2-135m")
    engines = args.engines.split(",")
    if "vllm" in engines and not VLLM_PYTHON.exists():
        sys.exit(f"no vLLM venv at {VLLM_PYTHON}: make test-vllm builds it (or pass --engines own)")
    batches = [int(b) for b in args.batches.split(",")]
    load_before = list(os.getloadavg())
    t0 = time.perf_counter()
    data = recipe_prompts(Path(args.games_dir))
    new_tokens = args.new_tokens or data["max_response_tokens"]
    threads = {"OMP_NUM_THREADS": str(args.threads)}
    common = ["--batches", args.batches, "--new-tokens", str(new_tokens), "--reps", str(args.reps),
              "--threads", str(args.threads)]
    measurements: list[dict[str, Any]] = []
    vllm_version = None
    with tempfile.TemporaryDirectory() as tmp:
        prompts_file = Path(tmp) / "prompts.json"
        prompts_file.write_text(json.dumps(data))
        if args.profile:
            profiles = [run_python(sys.executable, ["--worker", "profile", "--dtype", dtype, "--data",
                                                    str(prompts_file), *common], threads, args.timeout)
                        for dtype in args.dtypes.split(",")]
            record = results_record(args.name, {"config": str(CONFIG.relative_to(ROOT)),
                                                "model": str(MODEL.relative_to(ROOT)),
                                                "loadavg_1_5_15_before": load_before, "profiles": profiles})
            path = update_json_atomic(RESULTS_DIR / f"{args.name}.json", ("profile",), record,
                                      base={"benchmark": args.name})
            for p in profiles:
                print(f"own engine, {p['dtype']}, batch {p['batch']}, {p['new_tokens']} tokens: "
                      + "; ".join(f"{k} {json.dumps(v)}" for k, v in p["shares"].items()))
            print(f"wrote {path}")
            return
        for dtype in args.dtypes.split(","):
            for engine in engines:
                modes = args.vllm_modes.split(",") if engine == "vllm" else ["-"]
                for mode in modes:
                    argv_ = ["--worker", engine, "--dtype", dtype, "--data", str(prompts_file), *common,
                             "--eager", str(int(mode != "compiled"))]
                    if engine == "own":
                        answer = run_python(sys.executable, argv_, threads, args.timeout)
                    else:
                        answer = run_python(VLLM_PYTHON, argv_, {**threads, **VLLM_ENV,
                                                                 "VLLM_CPU_KVCACHE_SPACE": str(args.kv_gib)},
                                            args.timeout)
                        vllm_version = answer.pop("vllm")
                    label = engine if engine == "own" else f"vllm_{mode}"
                    measurements.append({"engine": label, "dtype": dtype, **answer})
                    print(f"{label} {dtype}: done ({time.perf_counter() - t0:.0f} s)", flush=True)
        steps: dict[str, Any] = {}
        step_runs: dict[str, Any] = {}
        if args.step_updates > 0:  # every engine as the per-call table names it: vLLM eager and compiled
            for engine in engines:
                for mode in args.vllm_modes.split(",") if engine == "vllm" else ["-"]:
                    label = engine if engine == "own" else f"vllm_{mode}"
                    python = sys.executable if engine == "own" else VLLM_PYTHON
                    env = threads if engine == "own" else {**threads, **VLLM_ENV, "VLLM_CPU_KVCACHE_SPACE": "1"}
                    run = run_python(python, ["--worker", "step", "--engine", engine, "--games-dir", args.games_dir,
                                              "--out", str(Path(tmp) / "runs" / label), "--step-updates",
                                              str(args.step_updates), "--batches", args.batches,
                                              "--eager", str(int(mode != "compiled"))], env, args.timeout)
                    step_runs[label] = run
                    steps[label] = step_summary(run["updates"])
                    print(f"RL step, {label}: done ({time.perf_counter() - t0:.0f} s)", flush=True)
    lengths = [len(p) for p in data["prompts"]]
    payload = {
        "config": str(CONFIG.relative_to(ROOT)),
        "model": str(MODEL.relative_to(ROOT)),
        "vllm_version": vllm_version,
        "shapes": {"batches": batches, "group": data["group"], "recipe_batch": 8, "new_tokens": new_tokens,
                   "temperature": data["temperature"], "top_p": data["top_p"], "reps": args.reps,
                   "threads": args.threads, "vllm_kv_gib": args.kv_gib, "prompts": len(lengths),
                   "prompt_tokens_min": min(lengths), "prompt_tokens_max": max(lengths),
                   "prompt_tokens_mean": round(statistics.fmean(lengths), 1)},
        "games": data["games"],
        "measurements": measurements,
        "steps": steps,
        "step_runs": step_runs,
        "loadavg_1_5_15_before": load_before,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    previous = committed(args.name) or {}
    if "profile" in previous:  # the last --profile run's, kept
        payload["profile"] = previous["profile"]
    path = write_json_atomic(RESULTS_DIR / f"{args.name}.json", results_record(args.name, payload))
    print_table(compare(measurements), ["engine", "dtype", "batch", "prompt_tokens", "ttft_s", "seconds",
                                        "tokens_per_s", "decode_tok_s", "vs_own"],
                title=f"\nSmolLM2-135M generation, recipe prompts, {new_tokens} new tokens, {args.threads} threads "
                      f"({machine_info()['cpu']})")
    if steps:
        print_table([{"engine": e, **s} for e, s in steps.items()],
                    ["engine", "step_s", "sync_s", "rollout_s", "analyze_s", "rollout_share", "engine_share"],
                    title="\nthe recipe's RL update (fp32), means after the first")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
