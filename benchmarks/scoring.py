"""CPU benchmark of the shared-prefix dual-context scorer against full forwards with materialized logits.

    python -m benchmarks.scoring             # P=1536, S=96, A=128, 2 samples, sweep: table + results JSON
    python -m benchmarks.scoring --quick     # smaller model, 1 sample, no sweep: a quick look

Baselines, each one packed varlen forward over all samples (no padding, like the scorer):
- naive        full forward, logits on every row (as verl/HF recompute log-probs), log_softmax, gather
- naive_resp   full forward, logits only on the rows that predict the response (a stricter baseline)
Measured for each insertion point (prepend / after_task / before_response) and prompt length:
- whole        seedfast.scoring.score: ℓold + ℓskill, one prefix pass and one two-branch pass
- student      score() on the same samples without privileged text (ℓold only)
- teacher      whole - student: what the teacher context adds to scoring
- teacher_kv   teacher_logprob_with_prefix from a prefix KV already in hand (teacher branches only)
- whole_hidden whole with keep_teacher_hidden=True (the teacher's hidden rows kept for full-vocabulary divergences)
Ratios: whole / (naive student + naive teacher), teacher / naive teacher (docs/performance.md: ≤ 0.3, issue 4: ≤ 0.25
with before_response; whole ≤ 0.6), whole_hidden / whole. Both sides run at the same torch thread count (--threads,
default torch's: one per core). Timings interleave the variants; ratios use the fastest of --reps (the run least
disturbed by other load), `ratios_median` the medians.
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import machine_info, median, print_table, write_results
from seedfast.context import Segment, StepSample, build_step_sample
from seedfast.model.config import DecoderConfig
from seedfast.model.decoder import build_decoder
from seedfast.scoring import score, teacher_logprob_with_prefix
from seedfast.scoring.packing import pack, pack_prefixes, shared_prefix_length

MODES = ("prepend", "after_task", "before_response")


def prompt_segments(length: int, vocab: int, gen: torch.Generator) -> list[Segment]:
    """An agent-step prompt of `length` tokens: system 32, task 64, history turns, observation 64, tail 24."""
    fixed = {"system": 32, "task": 64, "observation": 64, "instructions": 24}
    history = length - sum(fixed.values())
    if history < 0:
        raise ValueError(f"prompt length {length} is below the fixed part {sum(fixed.values())}")
    turns = [history // 5] * 5
    turns[-1] += history - sum(turns)

    def ids(n):
        return torch.randint(0, vocab, (n,), generator=gen)

    return ([Segment("system", ids(32)), Segment("task", ids(64))]
            + [Segment("history", ids(n)) for n in turns if n]
            + [Segment("observation", ids(64)), Segment("instructions", ids(24))])


def make_samples(batch, prompt_len, skill_len, response_len, mode, vocab, seed=0, jitter=0):
    """`jitter` > 0 shortens sample i's history by i * jitter tokens (RL batches have unequal lengths)."""
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(batch):
        segments = prompt_segments(prompt_len - i * jitter, vocab, gen)
        response = torch.randint(0, vocab, (response_len,), generator=gen)
        skill = torch.randint(0, vocab, (skill_len,), generator=gen)
        sample, _ = build_step_sample(segments, response, [(mode, skill)] if skill_len else [], sample_id=i)
        samples.append(sample)
    return samples


def naive_logprob(model, contexts, responses, response_rows_only: bool) -> torch.Tensor:
    """Full forward over context ⊕ response[:-1], materialized logits, fp32 log_softmax, gather."""
    packed = pack([torch.cat([c, r[:-1]]) for c, r in zip(contexts, responses)], [0] * len(contexts),
                  list(responses))
    hidden = model(packed.input_ids, packed.cu_seqlens)
    if response_rows_only:
        logits = hidden[packed.rows] @ model.lm_head_weight.T
        return torch.log_softmax(logits.float(), -1).gather(1, packed.targets[:, None])[:, 0]
    logits = hidden @ model.lm_head_weight.T
    logp = torch.log_softmax(logits.float(), -1)
    return logp[packed.rows, packed.targets]


def measure(model, samples, reps: int) -> dict:
    plain = [StepSample(prompt_ids=s.prompt_ids, response_ids=s.response_ids) for s in samples]
    prompts = [s.prompt_ids for s in samples]
    teacher_prompts = [s.teacher_prompt_ids() for s in samples]
    responses = [s.response_ids for s in samples]
    with torch.no_grad():
        prefix = pack_prefixes(samples, [shared_prefix_length(s) for s in samples])
        _, prefix_kv = model(prefix.input_ids, prefix.cu_seqlens, return_kv=True)
    variants = {
        "naive_student": lambda: naive_logprob(model, prompts, responses, False),
        "naive_teacher": lambda: naive_logprob(model, teacher_prompts, responses, False),
        "naive_resp_student": lambda: naive_logprob(model, prompts, responses, True),
        "naive_resp_teacher": lambda: naive_logprob(model, teacher_prompts, responses, True),
        "whole": lambda: score(model, samples),
        "student": lambda: score(model, plain),
        "teacher_kv": lambda: teacher_logprob_with_prefix(model, prefix_kv, samples),
        "whole_hidden": lambda: score(model, samples, keep_teacher_hidden=True),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    with torch.no_grad():
        for fn in variants.values():  # warm-up
            fn()
        for _ in range(reps):  # interleaved, so that load drift hits every variant alike
            for name, fn in variants.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    t = {name: min(v) for name, v in times.items()}
    t["teacher"] = max(t["whole"] - t["student"], 0.0)
    medians = {name: median(v) for name, v in times.items()}
    medians["teacher"] = max(medians["whole"] - medians["student"], 0.0)
    return t, medians


def ratios(t: dict) -> dict:
    return {
        "whole/naive_pair": t["whole"] / (t["naive_student"] + t["naive_teacher"]),
        "teacher/naive": t["teacher"] / t["naive_teacher"],
        "teacher_kv/naive": t["teacher_kv"] / t["naive_teacher"],
        "whole/naive_resp_pair": t["whole"] / (t["naive_resp_student"] + t["naive_resp_teacher"]),
        "teacher/naive_resp": t["teacher"] / t["naive_resp_teacher"],
        "teacher_kv/naive_resp": t["teacher_kv"] / t["naive_resp_teacher"],
        "whole_hidden/whole": t["whole_hidden"] / t["whole"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=1536)
    parser.add_argument("--skill", type=int, default=96)
    parser.add_argument("--response", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--sweep", type=int, nargs="*", default=[512, 1024, 2048],
                        help="further prompt lengths, before_response only")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES,
                        help="insertion points at --prompt")
    parser.add_argument("--jitter", type=int, default=0,
                        help="sample i gets a prompt i*jitter tokens shorter (0: equal lengths, which lets the "
                             "naive forwards use plain causal attention while the branches need a mask)")
    parser.add_argument("--quick", action="store_true", help="hidden 256, 2 layers, 1 sample, 1 rep, no sweep")
    parser.add_argument("--name", default=None, help="results file name (default: scoring or scoring_quick)")
    args = parser.parse_args()
    if args.quick:
        args.hidden, args.layers, args.batch, args.reps, args.sweep = 256, 2, 1, 1, []
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = DecoderConfig(model_type="llama", vocab_size=args.vocab, hidden_size=args.hidden,
                           intermediate_size=args.hidden * 8 // 3 // 32 * 32, num_hidden_layers=args.layers,
                           num_attention_heads=args.hidden // 64, num_key_value_heads=max(1, args.hidden // 128),
                           max_position_embeddings=4096)
    model = build_decoder(config, dtype=torch.float32, attn_backend="sdpa").eval()
    cases = [(args.prompt, mode) for mode in args.modes] + [(p, "before_response") for p in args.sweep]
    rows = []
    for prompt_len, mode in cases:
        samples = make_samples(args.batch, prompt_len, args.skill, args.response, mode, args.vocab,
                               jitter=args.jitter)
        t, medians = measure(model, samples, args.reps)
        row = {"P": prompt_len, "S": args.skill, "A": args.response, "mode": mode,
               "k": samples[0].insert_at, "shared": shared_prefix_length(samples[0]),
               **{f"t_{name}": value for name, value in t.items()}, **ratios(t),
               "median_s": medians, "ratios_median": ratios(medians)}
        rows.append(row)
        print_table([row], ["P", "mode", "k", "t_naive_student", "t_naive_teacher", "t_whole", "t_student",
                            "t_teacher", "t_teacher_kv", "whole/naive_pair", "teacher/naive",
                            "teacher_kv/naive"])
        print(flush=True)
    columns = ["P", "mode", "whole/naive_pair", "teacher/naive", "teacher_kv/naive", "whole/naive_resp_pair",
               "teacher/naive_resp", "teacher_kv/naive_resp", "whole_hidden/whole"]
    print_table(rows, columns, title=f"ratios (seconds in the JSON); {machine_info()['cpu']}, "
                                     f"{torch.get_num_threads()} threads")
    path = write_results(args.name or ("scoring_quick" if args.quick else "scoring"), {
        "model": {"model_type": "llama", "hidden": args.hidden, "layers": args.layers, "vocab": args.vocab,
                  "heads": config.num_attention_heads, "kv_heads": config.num_key_value_heads,
                  "intermediate": config.intermediate_size, "dtype": "float32", "attn_backend": "sdpa"},
        "batch": args.batch, "jitter": args.jitter, "reps": args.reps, "threads": torch.get_num_threads(),
        "timing": "min of reps",
        "rows": rows,
        "targets": {"teacher/naive (before_response)": 0.25, "whole/naive_pair": 0.6},
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
