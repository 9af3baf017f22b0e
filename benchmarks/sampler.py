"""Generation throughput of the own sampler on CPU: static KV cache vs growing a PackedKV vs no cache.

    python -m benchmarks.sampler                      # the demo's tiny decoder, batches 8/32/64
    python -m benchmarks.sampler --batches 64 --new-tokens 64 --threads 2

Variants (greedy, no stop ids, so every sequence generates exactly --new-tokens tokens):
  static_cache  seedfast.rollout.Sampler: prefill, then one token per step into a preallocated cache
  packed_concat the decoder's own past=PackedKV path, the cache grown with PackedKV.concat every step
  no_cache      Sampler(use_cache=False): prompt + generated tokens re-run every step
With --group G, each batch is also run as batch/G distinct prompts repeated G times (the first step of a
rollout): the sampler prefills each distinct prompt once, packed_concat does not deduplicate.
tokens_per_s counts generated tokens over the whole call (prefill included); decode_ms_per_step is
(seconds - prefill_s) / (new_tokens - 1), prefill_s timed separately as a 1-token generation.
Prints a table and writes benchmarks/results/sampler_cpu.json (machine, versions, shapes, numbers).
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import print_table, write_results
from seedfast.model import DecoderConfig, build_decoder, make_cu_seqlens
from seedfast.rollout.own_engine import Sampler
from seedfast.sampling_params import SamplingParams


def tiny_decoder(vocab: int) -> torch.nn.Module:
    """The CPU demo's policy: Qwen3-style, hidden 128, 4 layers, GQA 4/2 (docs/performance.md, 'CPU demo scale')."""
    cfg = DecoderConfig(model_type="qwen3", vocab_size=vocab, hidden_size=128, intermediate_size=384,
                        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                        tie_word_embeddings=True)
    return build_decoder(cfg, dtype=torch.float32, attn_backend="sdpa", seed=0).eval()


def packed_concat_generate(model, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Greedy decoding through the decoder's past=PackedKV API, concatenating the cache every step."""
    with torch.inference_mode():
        ids = torch.tensor([t for p in prompts for t in p])
        cu = make_cu_seqlens([len(p) for p in prompts])
        hidden, kv = model(ids, cu, return_kv=True)
        last = hidden[cu[1:].long() - 1]
        out = []
        step_cu = torch.arange(len(prompts) + 1, dtype=torch.int32)
        for step in range(new_tokens):
            token = (last @ model.lm_head_weight.T).argmax(-1)
            out.append(token)
            if step + 1 == new_tokens:
                break
            last, new = model(token, step_cu, past=kv, return_kv=True)
            kv = kv.concat(new)
    return torch.stack(out, 1).tolist()


def run(model, variant: str, prompts: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]]]:
    start = time.perf_counter()
    if variant == "packed_concat":
        out = packed_concat_generate(model, prompts, new_tokens)
    else:
        sampler = Sampler(model, use_cache=variant == "static_cache")
        out = sampler.generate(prompts, SamplingParams(new_tokens, temperature=0.0))
    return time.perf_counter() - start, out


def prefill_seconds(model, prompts: list[list[int]]) -> float:
    start = time.perf_counter()
    Sampler(model).generate(prompts, SamplingParams(1, temperature=0.0))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="8,32,64", help="sequences per generate call (comma-separated)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-min", type=int, default=150)
    parser.add_argument("--prompt-max", type=int, default=300, help="prompts ~175-315 tokens in the demo")
    parser.add_argument("--vocab", type=int, default=1400)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--no-cache-max-batch", type=int, default=32, help="skip no_cache above this batch")
    parser.add_argument("--group", type=int, default=8,
                        help="also run batches made of batch/group distinct prompts, each repeated group times "
                             "(a rollout's first step: N trajectories per task); 1 = skip")
    parser.add_argument("--name", default="sampler_cpu")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = tiny_decoder(args.vocab)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        groups = [1] + ([args.group] if args.group > 1 and batch % args.group == 0 else [])
        for group in groups:
            lengths = torch.randint(args.prompt_min, args.prompt_max + 1, (batch // group,), generator=gen).tolist()
            distinct = [torch.randint(0, args.vocab, (n,), generator=gen).tolist() for n in lengths]
            prompts = [p for p in distinct for _ in range(group)]
            run(model, "static_cache", prompts[:2], 2)  # warm-up
            prefill = prefill_seconds(model, prompts)
            reference = None
            for variant in ("static_cache", "packed_concat", "no_cache"):
                if variant == "no_cache" and (batch > args.no_cache_max_batch or group > 1):
                    continue
                seconds, out = run(model, variant, prompts, args.new_tokens)
                reference = reference or out
                generated = batch * args.new_tokens
                rows.append({
                    "batch": batch, "group": group, "variant": variant, "prompt_tokens": sum(lengths) * group,
                    "new_tokens": args.new_tokens, "seconds": round(seconds, 4), "prefill_s": round(prefill, 4),
                    "tokens_per_s": round(generated / seconds, 1),
                    "decode_ms_per_step": round(1000 * max(seconds - prefill, 0.0) / max(args.new_tokens - 1, 1), 2),
                    "same_tokens_as_static_cache": out == reference,
                })
    columns = ["batch", "group", "variant", "prompt_tokens", "seconds", "prefill_s", "tokens_per_s",
               "decode_ms_per_step", "same_tokens_as_static_cache"]
    print_table(rows, columns, title=f"greedy generation, tiny decoder (hidden 128, 4 layers), CPU, "
                                     f"{torch.get_num_threads()} threads")
    for batch, group in sorted({(r["batch"], r["group"]) for r in rows}):
        by = {r["variant"]: r for r in rows if (r["batch"], r["group"]) == (batch, group)}
        for other in ("packed_concat", "no_cache"):
            if other in by:
                speedup = by[other]["seconds"] / by["static_cache"]["seconds"]
                print(f"batch {batch} (group {group}): static_cache is {speedup:.1f}x faster than {other}")
    path = write_results(args.name, {
        "model": {"model_type": "qwen3", "hidden": 128, "layers": 4, "heads": 4, "kv_heads": 2,
                  "intermediate": 384, "vocab": args.vocab, "dtype": "fp32"},
        "shapes": {"prompt_len_range": [args.prompt_min, args.prompt_max], "new_tokens": args.new_tokens,
                   "group": args.group},
        "rows": rows,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
