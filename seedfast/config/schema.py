"""The run configuration's schema: one dataclass per section, every field with its default and a one-line doc.

Defaults are the papers' (docs/algorithms.md, 'Defaults'); `opt` also records a field's numeric bounds and an
optional parser for string shorthands (`env.levels=3-6`), which loading.py checks. Nothing here reads YAML or
validates: `Config()` is the all-defaults config, `seedfast.config.load_config` the checked one.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from seedfast.config.yaml_io import dump_yaml


class ConfigError(ValueError):
    """A config value or key that a run cannot use; the message names the key."""


class ConfigWarning(UserWarning):
    """A legal but suspicious setting (e.g. groups of one trajectory)."""


Algorithm = Literal["grpo", "sdar", "seed", "grsd"]
# the file a run folder keeps its resolved config in (Config.save writes it, load_config reads a folder through it)
CONFIG_FILE = "config.yaml"
TEXTWORLD_GAME_TYPES = ("treasure_hunter", "coin_collector", "cooking")
# ALFWorld's own names, the part of a game folder before the first '-' (envs/alfworld.py TASK_TYPES); 'all' = every one
ALFWORLD_TASK_TYPES = (
    "all", "pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place",
)

# ScienceWorld's task table, (id, name) (envs/scienceworld_env.py reads the wheel's; tests/scienceworld/ checks they
# agree), and the simplifications its simulator takes
SCIENCEWORLD_TASKS = (
    ("1-1", "boil"), ("1-2", "melt"), ("1-3", "freeze"), ("1-4", "change-the-state-of-matter-of"),
    ("2-1", "use-thermometer"), ("2-2", "measure-melting-point-known-substance"),
    ("2-3", "measure-melting-point-unknown-substance"), ("3-1", "power-component"),
    ("3-2", "power-component-renewable-vs-nonrenewable-energy"), ("3-3", "test-conductivity"),
    ("3-4", "test-conductivity-of-unknown-substances"), ("4-1", "find-living-thing"),
    ("4-2", "find-non-living-thing"), ("4-3", "find-plant"), ("4-4", "find-animal"), ("5-1", "grow-plant"),
    ("5-2", "grow-fruit"), ("6-1", "chemistry-mix"), ("6-2", "chemistry-mix-paint-secondary-color"),
    ("6-3", "chemistry-mix-paint-tertiary-color"), ("7-1", "lifespan-longest-lived"),
    ("7-2", "lifespan-shortest-lived"), ("7-3", "lifespan-longest-lived-then-shortest-lived"),
    ("8-1", "identify-life-stages-1"), ("8-2", "identify-life-stages-2"), ("9-1", "inclined-plane-determine-angle"),
    ("9-2", "inclined-plane-friction-named-surfaces"), ("9-3", "inclined-plane-friction-unnamed-surfaces"),
    ("10-1", "mendelian-genetics-known-plant"), ("10-2", "mendelian-genetics-unknown-plant"),
)
SCIENCEWORLD_SIMPLIFICATIONS = ("easy", "teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors",
                                "noElectricalAction")


def opt(default: Any, doc: str, *, gt: float | None = None, ge: float | None = None,
        lt: float | None = None, le: float | None = None, parse: Callable[[Any], Any] | None = None) -> Any:
    """A schema field: default, one-line doc, optional numeric bounds and a parser for string shorthands."""
    meta = {"doc": doc, "gt": gt, "ge": ge, "lt": lt, "le": le, "parse": parse}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


def section(cls: type, doc: str) -> Any:
    return field(default_factory=cls, metadata={"doc": doc})


def _parse_levels(value: Any) -> Any:
    """'3-6' -> [3, 4, 5, 6]; '1,3' -> [1, 3]; 4 -> [4]; anything else is left for the type check."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, str):
        if re.fullmatch(r"\s*\d+\s*-\s*\d+\s*", value):
            lo, hi = (int(x) for x in value.split("-"))
            return list(range(lo, hi + 1))
        if re.fullmatch(r"\s*\d+\s*(,\s*\d+\s*)*", value):
            return [int(x) for x in value.split(",")]
    return value


def _parse_names(value: Any) -> Any:
    """'boil, melt' -> ['boil', 'melt']; a list is left for the type check."""
    if isinstance(value, str):
        return [x.strip() for x in value.split(",") if x.strip()]
    return value


def _parse_step_range(key: str, text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if not m or int(m.group(1)) > int(m.group(2)):
        raise ConfigError(f"{key}: expected A:B with 0 <= A <= B (steps A through B), got {text!r}")
    return int(m.group(1)), int(m.group(2))


# --------------------------------------------------------------------------------------------- schema


@dataclass
class RunConfig:
    name: str = opt("seedfast", "run name; everything the run writes goes to <out_dir>/<name>/")
    out_dir: str = opt("runs", "folder that holds the run folders")
    seed: int = opt(0, "random seed (initialisation, sampling, shuffling)", ge=0)


@dataclass
class TinyModelConfig:
    hidden: int = opt(128, "hidden size of the from-scratch Qwen3-style decoder", ge=1)
    layers: int = opt(4, "decoder layers", ge=1)
    heads: int = opt(4, "attention heads (hidden must be a multiple)", ge=1)
    kv_heads: int = opt(2, "key/value heads, grouped-query attention (must divide heads)", ge=1)
    intermediate: int = opt(384, "SwiGLU MLP inner size", ge=1)
    max_seq_len: int = opt(4096, "longest sequence the rotary tables cover", ge=1)
    rope_theta: float = opt(10000.0, "rotary embedding base", gt=0)
    qk_norm: bool = opt(True, "RMSNorm on queries and keys (Qwen3 style)")
    tie_embeddings: bool = opt(True, "LM head shares the embedding matrix")
    vocab_size: int | None = opt(None, "null = the tokenizer's vocabulary size", ge=1)
    bpe_vocab_size: int = opt(2048, "vocabulary asked of the BPE tokenizer trained on game text", ge=260)
    bpe_min_frequency: int = opt(2, "merges seen fewer times are not learned", ge=1)


@dataclass
class LoRAConfig:
    rank: int = opt(0, "LoRA rank r; 0 = full fine-tuning (every weight trained). r > 0: the base weights frozen in "
                       "model.dtype, trainable adapters in optim.master_dtype (docs/algorithms.md, 'LoRA')", ge=0)
    alpha: float = opt(32.0, "the adapter's update is scaled by alpha / rank", gt=0)
    targets: list[str] = opt(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                             "linear layers of every decoder block that get an adapter")
    adapter: str | None = opt(None, "a PEFT adapter folder (adapter_config.json + adapter_model.safetensors) to "
                                    "start from and go on training; null = fresh adapters (B = 0)")


@dataclass
class ModelConfig:
    path: str | None = opt(None, "HF model folder (config.json + safetensors); null = tiny decoder of model.tiny")
    tokenizer: str | None = opt(None, "tokenizer folder; null = the policy folder's, else <run_dir>/tokenizer "
                                      "(a tiny model's)")
    ref_path: str | None = opt(None, "reference policy for the KL term; null = the policy the RL run starts from")
    dtype: Literal["bf16", "fp16", "fp32"] = opt(
        "bf16", "compute dtype: forward and backward, rollout, the exported policy (the trained weights and AdamW "
                "states are optim.master_dtype)")
    attn_backend: Literal["auto", "flash", "sdpa", "flex"] = opt(
        "auto", "attention kernel; auto = flash-attn varlen on CUDA when installed, else FlexAttention on CUDA, "
        "sdpa on CPU (flex has no backward on CPU)")
    tiny: TinyModelConfig = section(TinyModelConfig, "from-scratch decoder used when model.path is null")
    lora: LoRAConfig = section(LoRAConfig, "low-rank adapters instead of full fine-tuning (RL and SFT)")


@dataclass
class ScienceWorldConfig:
    tasks: list[str] = opt(["find-non-living-thing"], "ScienceWorld task names or ids ('1-1'), a list or 'a,b'; "
                                                      "`seedfast envs list scienceworld` lists the 30",
                           parse=_parse_names)
    simplifications: str = opt("easy", "comma-separated simplifications the simulator applies ('easy' = all of "
                                       "them; '' = none; docs/environments.md, 'ScienceWorld')")
    heap_mb: int = opt(512, "-Xmx of each simulator's JVM, in MiB; with the JVM's measured overhead it bounds the "
                            "environment slots by the machine's memory", ge=128)
    call_timeout_s: float = opt(10.0, "seconds one simulator step may take before its JVM is killed and the episode "
                                      "fails (below env.step_timeout_s, so the environment fails first)", gt=0)
    max_text_chars: int = opt(2000, "characters of an observation's text (feedback, room, inventory) before its "
                                    "tail is cut, the cut said in the text", ge=200)


@dataclass
class EnvConfig:
    kind: Literal["textworld", "alfworld", "scienceworld"] = opt("textworld", "environment family")
    game_type: str = opt("treasure_hunter", "TextWorld challenge, or ALFWorld task type ('all')")
    levels: list[int] = opt([1, 2, 3, 4, 5], "TextWorld difficulty levels: a list or a range like 3-6",
                            parse=_parse_levels)
    n_train: int | None = opt(16, "TextWorld: training games per level; ALFWorld: games, null = all; ScienceWorld: "
                                  "train variations per task, null = all", ge=1)
    n_eval: int | None = opt(8, "TextWorld: held-out games per level; ALFWorld: games, null = all; ScienceWorld: dev "
                                "variations per task (selection; the test variations are `seedfast eval --split "
                                "test`'s alone), null = all", ge=1)
    games_dir: str = opt("games", "where games are generated (TextWorld) or read from (ALFWorld data); ScienceWorld: "
                                  "where the train variations' gold sequences are cached")
    games_seed: int = opt(0, "TextWorld: first seed of game generation, apart from run.seed so game pools stay fixed",
                          ge=0)
    workers: int = opt(0, "TextWorld: processes used to generate games; 0 = all CPUs", ge=0)
    max_steps: int = opt(50, "environment steps per episode before it counts as failed", ge=1)
    history_k: int = opt(5, "past (observation, action) pairs kept in each step prompt", ge=0)
    invalid_penalty: float = opt(0.1, "reward subtracted at a step whose action is invalid", ge=0)
    step_timeout_s: float = opt(30.0, "seconds one environment step may take", gt=0)
    step_delay_s: float = opt(0.0, "seconds added to every environment step (a sleep after the game's own step): "
                                   "plays a slower environment than the game, as benchmarks/async_grid.py does",
                              ge=0)
    isolation: Literal["process", "inline"] = opt(
        "process", "process = slots hosted by a few worker processes (one per usable CPU; per-step timeouts, crash "
                   "restart and replay); inline = in this process")
    slots: int = opt(0, "environments stepped at once; 0 = enough for a rollout batch (tasks_per_batch x n) and "
                        "every eval game", ge=0)
    damaged_games: Literal["error", "skip"] = opt(
        "error", "TextWorld: a game of a split whose files are missing or differ from the manifest's sizes and "
                 "sha256: error = stop, naming every such file; skip = play without it, warned and counted "
                 "(rollout/games_skipped, eval/games_skipped)")
    scienceworld: ScienceWorldConfig = section(ScienceWorldConfig, "ScienceWorld's tasks, simplifications and JVM")


@dataclass
class CorrectionConfig:
    mode: Literal["none", "token_tis", "seq_tis", "seq_geo_mask", "token_mask"] = opt(
        "none", "train/rollout mismatch correction of the policy term (docs/algorithms.md, 'Rollout correction'): "
                "none, token_tis (w = min(rho_t, token_clip)), seq_tis (w = min(prod rho_t, seq_clip)), seq_geo_mask "
                "(keep a sequence whose geometric-mean ratio is in [geo_low, geo_high]), token_mask (IcePop: "
                "w = rho_t inside [token_low, token_high], else 0); rho = pi_train(theta_old) / pi_rollout")
    token_clip: float = opt(2.0, "token_tis: the per-token importance weight is truncated at this value", gt=0)
    seq_clip: float = opt(5.0, "seq_tis: the per-sequence importance weight is truncated at this value", gt=0)
    geo_low: float = opt(0.99, "seq_geo_mask: lowest geometric-mean ratio a sequence may have and stay", gt=0)
    geo_high: float = opt(1.01, "seq_geo_mask: highest geometric-mean ratio a sequence may have and stay", gt=0)
    token_low: float = opt(0.5, "token_mask: tokens with a ratio below this are masked out", gt=0)
    token_high: float = opt(5.0, "token_mask: tokens with a ratio above this are masked out", gt=0)
    seq_unit: Literal["trajectory", "step"] = opt(
        "trajectory", "seq_tis, seq_geo_mask: the sequence whose token ratios make one weight: trajectory = every "
                      "step sample of one trajectory shares the weight of all its response tokens (its advantage is "
                      "the trajectory's), step = each step sample alone (docs/algorithms.md, 'Rollout correction')")
    warn_masked_share: float = opt(0.3, "warn (once per update) when the correction masks more than this share of "
                                        "the response tokens or of the sequences", ge=0, le=1)


@dataclass
class RolloutConfig:
    n: int = opt(8, "trajectories per task: the GRPO group size", ge=1)
    tasks_per_batch: int = opt(16, "tasks per RL update (batch = tasks_per_batch x n trajectories)", ge=1)
    task_pool: int | None = opt(None, "RL draws its tasks from a fixed pool of this many training games (chosen "
                                      "with run.seed), so games recur across updates; null = all training games",
                                ge=1)
    temperature: float = opt(1.0, "sampling temperature of training rollouts (also divides logits in loss)",
                             gt=0)
    top_p: float = opt(1.0, "nucleus sampling mass", gt=0, le=1)
    max_response_tokens: int = opt(512, "tokens the policy may generate per step", ge=1)
    max_prompt_length: int = opt(2048, "prompt tokens per step; history is dropped from the left first",
                                 ge=1)
    eval_temperature: float = opt(0.4, "sampling temperature at evaluation (0 = greedy)", ge=0)
    engine: Literal["own", "vllm"] = opt("own", "generation engine: own KV-cache engine, or vLLM")
    gpu_memory_utilization: float = opt(0.5, "vLLM only: share of GPU memory for weights and KV cache",
                                        gt=0, le=1)
    tensor_parallel: int = opt(1, "vLLM only: tensor-parallel size of the rollout engine", ge=1)
    vllm_enforce_eager: bool = opt(False, "vLLM only: run the model eagerly (no torch.compile, no CUDA graphs): a "
                                          "faster start, slower decoding (on a small CPU the compile alone takes "
                                          "minutes)")
    vllm_dtype: Literal["fp32", "bf16", "fp16"] | None = opt(
        None, "vLLM only: the engine's compute dtype, and the dtype of the weights pushed to it; null = model.dtype. "
              "bf16 beside an fp32 trainer is the mismatch rollout.correction corrects")
    vllm_max_num_seqs: int | None = opt(None, "vLLM only: most sequences the engine schedules at once; null = "
                                              "vLLM's default", ge=1)
    vllm_max_model_len: int | None = opt(None, "vLLM only: longest prompt + completion the engine holds (sizes its "
                                               "KV-cache blocks per sequence); at least rollout.max_prompt_length + "
                                               "rollout.max_response_tokens; null = the model's own limit", ge=1)
    sync_bucket_mb: int = opt(512, "vLLM in the RL loop, or the rollout producer (rollout.max_staleness > 0): after "
                                   "every update the policy's weights are gathered one tensor at a time and sent to "
                                   "the engine in buckets of about this many MiB",
                              ge=1)
    vllm_sleep: bool = opt(True, "vLLM in the RL loop: the colocated engine sleeps during the update (its weights "
                                 "and KV cache freed) and wakes before the weight push")
    lora_sync: Literal["auto", "adapter", "merged"] = opt(
        "auto", "LoRA (model.lora) with an engine that holds its own copy of the policy (vLLM, the rollout producer): "
                "after every update send the adapters alone (the engine keeps the base and applies them: vLLM's LoRA "
                "serving, the producer's own adapted copy; the trainer's values bit for bit, checked by fingerprint "
                "every push) or the merged weights W + s·B·A (the whole model each push); auto = adapter for the own "
                "engine, merged for vLLM, as measured on the CPU (docs/scaling.md, 'LoRA weight sync')")
    max_staleness: int = opt(0, "asynchronous RL: a rollout producer in its own process rolls out update s on the "
                                "policy of update s - max_staleness (docs/architecture.md, 'Asynchronous rollouts'); "
                                "0 = the synchronous loop (rollout, then update, on the same weights)", ge=0)
    devices: list[int] | None = opt(
        None, "asynchronous RL: the GPUs (CUDA indices as the trainer sees them, e.g. 6-7) the rollout producer's "
              "engine runs on, apart from the trainer's (LOCAL_RANK 0..n-1 under torchrun, else GPU 0), the weights "
              "sent over an NCCL group; as many as rollout.tensor_parallel with vLLM, one with the own engine; null = "
              "the trainer's device (CPU only: docs/architecture.md, 'Asynchronous rollouts')", parse=_parse_levels)
    producer_timeout_s: float | None = opt(
        1800.0, "asynchronous RL: seconds the trainer waits for the rollout producer (its start, one update's rollout, "
                "one weight send) before it ends the run with one line naming the update and the resume point; null = "
                "wait for ever (docs/architecture.md, 'Asynchronous rollouts')", gt=0)
    correction: CorrectionConfig = section(
        CorrectionConfig, "train/rollout mismatch correction: importance weights or masks from the log-probs the "
                          "engine sampled with, and their diagnostics")


@dataclass
class ExternalAnalyzerConfig:
    endpoint: str | None = opt(None, "OpenAI-compatible base URL, e.g. http://localhost:8000/v1")
    model: str | None = opt(None, "model name sent to the endpoint")
    api_key_env: str = opt("OPENAI_API_KEY", "environment variable holding the API key (never the key)")
    timeout_s: float = opt(120.0, "seconds per request", gt=0)
    retries: int = opt(3, "retries per request after a failure or an unparsable answer", ge=0)
    concurrency: int = opt(8, "requests in flight at once", ge=1)
    temperature: float = opt(0.0, "sampling temperature of the external analyzer", ge=0)


@dataclass
class SkillConfig:
    analyzer: Literal["self", "external", "oracle"] = opt(
        "self", "who writes skills during RL: self = pi_old (SEED), external endpoint, oracle (walkthrough)")
    collect_analyzer: Literal["external", "oracle", "self"] = opt(
        "external", "who labels stage-1 trajectories for skill SFT (seedfast collect)")
    external: ExternalAnalyzerConfig = section(ExternalAnalyzerConfig, "OpenAI-compatible analyzer")
    skill_mode: Literal["episode_only", "episode_step", "step_only"] = opt(
        "episode_only", "skill granularity: one per episode, plus step skills, or step skills only")
    teacher_mode: Literal["step_priority", "additive"] = opt(
        "step_priority", "a step with a step skill uses it instead of (step_priority) or besides the episode skill")
    insertion: Literal["after_task", "before_response", "prepend"] = opt(
        "before_response", "where the episode skill goes in the teacher prompt (step skills always go late)")
    teacher_params: Literal["old", "current"] = opt("old", "parameters that score the teacher context")
    max_skill_tokens: int = opt(256, "longest skill inserted into a teacher prompt, in tokens", ge=1)
    max_analysis_tokens: int = opt(512, "tokens the analyzer may generate (summary + skill JSON)", ge=1)
    analysis_temperature: float = opt(0.0, "sampling temperature when the policy analyzes (0 = greedy)", ge=0)
    library: str | None = opt(None, "static skill library file (SDAR provider); null = per-task skills")
    shuffle: Literal["none", "derange"] = opt(
        "none", "the shuffled-skill control (docs/study.md): derange = each trajectory reads the analyzer's skills of "
        "the same-index trajectory of another game of its update (a seeded derangement of the update's games)")


@dataclass
class LossConfig:
    clip_low: float = opt(0.2, "PPO clip epsilon below 1", gt=0, lt=1)
    clip_high: float = opt(0.2, "PPO clip epsilon above 1", gt=0, lt=1)
    dual_clip: float | None = opt(3.0, "dual-clip bound c for negative advantages; null = off", gt=1)
    kl_coef: float = opt(0.01, "weight of the KL penalty to the reference policy", ge=0)
    kl_kind: Literal["low_var_kl", "k1", "k2"] = opt("low_var_kl", "KL estimator")
    entropy_coef: float = opt(0.001, "entropy bonus weight", ge=0)
    opd_coef: float = opt(0.01, "weight of the on-policy distillation term (SEED, SDAR)", ge=0)
    opd_beta: float = opt(5.0, "gate sharpness beta", ge=0)
    gate: Literal["gap", "entropy", "soft_or"] = opt("gap", "OPD gate (opd_mode gate)")
    opd_mode: Literal["gate", "advantage", "reverse_kl", "jsd"] = opt(
        "gate", "form of the teacher term (SEED, SDAR): gate = the paper's gated self-imitation, raises sampled tokens "
        "only; advantage = the signed shift lambda*clip(l_skill - l_old) added to the advantage inside the clipped "
        "policy term (tinker-cookbook / slime OPD); reverse_kl = KL(student || sg teacher) over the whole vocabulary "
        "at every response token; jsd = the generalized JSD_beta of TRL's GKD over the whole vocabulary (no logits are "
        "materialized for either)")
    opd_adv_clip: float = opt(3.0, "opd_mode advantage: |l_skill - l_old| is clipped to this many nats", gt=0)
    opd_jsd_beta: float = opt(0.5, "opd_mode jsd: beta of the generalized JSD (0 forward KL, 1 reverse KL)",
                              ge=0, le=1)
    agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = opt(
        "token-mean", "how per-token terms are aggregated")
    adv_norm: Literal["mean_std", "mean"] = opt("mean_std", "group advantage: subtract mean, divide by std")
    adv_eps: float = opt(1e-6, "added to the group std", gt=0)
    step_penalty: Literal["after_norm", "in_reward"] = opt(
        "after_norm", "how the invalid-action penalty enters the advantage: subtracted raw after the group "
        "normalization of the outcome (it can never outweigh a win), or inside the reward before it (the "
        "reference code; in all-fail groups the std division makes the penalty as large as a win)")


@dataclass
class GRSDConfig:
    lam: float = opt(0.5, "strength lambda_g of the turn-level advantage modulation", ge=0)
    g_max: float = opt(0.2, "clip of the normalized modulation", gt=0)
    eta: float = opt(0.0, "dead zone: |q| at or below eta is zeroed", ge=0)
    reflection_coef: float = opt(0.01, "weight alpha of the RL loss on reflection tokens", ge=0)
    judge: Literal["external", "oracle"] = opt(
        "external", "who scores reflections 0-3: an external model, or the walkthrough oracle (tests, CPU demo)")
    max_reflection_tokens: int = opt(256, "tokens per reflection", ge=1)
    max_guidance_tokens: int = opt(384, "tokens of the DO / AVOID group guidance", ge=1)


@dataclass
class OptimConfig:
    lr: float = opt(1e-6, "AdamW learning rate of RL", gt=0)
    weight_decay: float = opt(0.01, "AdamW weight decay of RL (SFT's: sft.weight_decay)", ge=0)
    grad_clip: float | None = opt(1.0, "global gradient-norm clip, RL and SFT; null = off", gt=0)
    betas: list[float] = opt([0.9, 0.999], "AdamW betas, RL and SFT")
    eps: float = opt(1e-8, "AdamW epsilon, RL and SFT", gt=0)
    master_dtype: Literal["fp32", "bf16", "fp16"] = opt(
        "fp32", "dtype of the trained (master) weights and AdamW states, RL and SFT; below fp32 an update of ~lr "
                "rounds away (a warning measures how much: docs/scaling.md, 'Precision')")
    warmup_steps: int = opt(0, "linear warm-up optimizer steps of RL (every mini-batch step counts: "
                               "trainer.ppo_epochs x trainer.mini_batches per update): step s < N runs at "
                               "lr * (s + 1) / (N + 1), so 1 gives lr / 2 then lr (SFT's: sft.warmup_steps)", ge=0)
    schedule: Literal["constant", "cosine"] = opt(
        "constant", "RL learning-rate schedule after warm-up (SFT's: sft.schedule)")
    min_lr_ratio: float = opt(0.0, "RL cosine floor as a fraction of lr", ge=0, le=1)


@dataclass
class TrainerConfig:
    steps: int = opt(150, "RL updates", ge=1)
    ppo_epochs: int = opt(1, "passes over each batch", ge=1)
    mini_batches: int = opt(1, "optimizer steps per epoch (the batch is split into this many)", ge=1)
    micro_batch_tokens: int = opt(16384, "packed tokens per forward/backward (a sample is never split)", ge=1)
    eval_every: int = opt(10, "evaluate every this many updates; 0 = only at the end", ge=0)
    eval_games: int | None = opt(None, "held-out games per evaluation, in the loop and in `seedfast eval`; null = "
                                         "env.n_eval", ge=1)
    eval_repeats: int = opt(1, "plays of each held-out game per evaluation (sampled at rollout.eval_temperature; "
                               "a greedy evaluation plays each game once)", ge=1)
    checkpoint_every: int = opt(10, "checkpoint every this many updates; 0 = only at the end", ge=0)
    keep_checkpoints: int = opt(2, "newest checkpoints kept on disk", ge=1)
    max_bad_steps: int = opt(3, "non-finite (NaN/inf) updates in a row before the run stops", ge=1)
    profile_steps: str | None = opt(None, "A:B = capture steps A through B (NVTX, cudaProfilerStart/Stop)")
    resume: str | None = opt(None, "null = fresh start; auto = newest checkpoint of this run; or a ckpt path")
    init_from: str | None = opt(None, "policy the RL run starts from; null = this run's SFT output, else model")
    device: Literal["auto", "cpu", "cuda"] = opt("auto", "auto = cuda when available")

    def profile_range(self) -> range | None:
        """The steps to profile, both ends included, or None."""
        if self.profile_steps is None:
            return None
        start, end = _parse_step_range("trainer.profile_steps", self.profile_steps)
        return range(start, end + 1)


@dataclass
class DistConfig:
    strategy: Literal["none", "fsdp"] = opt(
        "none", "none = one process on one device; fsdp = FSDP2 (fully_shard) over the torchrun processes "
                "(docs/scaling.md)")
    dp_shard: int | None = opt(None, "ranks the parameters are sharded over (FSDP2); null = WORLD_SIZE / tp", ge=1)
    tp: int = opt(1, "tensor-parallel degree (column/row-parallel attention and MLP, vocabulary-parallel "
                     "embedding and LM head); tp consecutive ranks form a group (one node's GPUs)", ge=1)
    activation_checkpointing: bool = opt(False, "recompute each decoder block in backward instead of keeping its "
                                                "activations (any strategy; `seedfast plan` shows both)")
    reduce_dtype: Literal["fp32", "bf16", "fp16"] = opt(
        "fp32", "dist.strategy=fsdp: dtype gradients are reduced in across ranks (FSDP2 gathers the parameters in "
                "model.dtype over optim.master_dtype masters)")


@dataclass
class SFTConfig:
    epochs: int = opt(3, "passes over the SFT data", ge=1)
    lr: float = opt(5e-6, "learning rate of SFT", gt=0)
    batch_tokens: int = opt(16384, "packed tokens per optimizer step", ge=1)
    weight_decay: float = opt(0.0, "AdamW weight decay of SFT", ge=0)
    warmup_steps: int = opt(0, "linear warm-up optimizer steps of SFT: step s < N runs at lr * (s + 1) / (N + 1), "
                               "so 1 gives lr / 2 then lr", ge=0)
    max_seconds: float | None = opt(None, "stop after this wall time; null = run all epochs", gt=0)
    data: str | None = opt(None, "JSONL of (analyzer prompt, skill JSON) pairs; null = this run's collect output")
    behaviour_cloning: bool = opt(False, "also train on walkthrough trajectories (tiny model from scratch)")
    prompt_loss: bool = opt(False, "behaviour cloning: loss on prompt tokens too (teaches the language)")
    prompt_loss_weight: float = opt(1.0, "weight of a prompt token in the SFT loss relative to an answer token "
                                         "(with prompt_loss)", gt=0, le=1)
    skill_augment: bool = opt(False, "behaviour cloning: also show prompts with an oracle skill inserted")
    skill_augment_fraction: float = opt(0.5, "share of behaviour-cloning samples given a skill", ge=0, le=1)
    skill_writing_fraction: float = opt(1.0, "share of games whose replays also give skill-writing examples",
                                        ge=0, le=1)
    schedule: Literal["constant", "cosine"] = opt("cosine", "SFT learning-rate schedule after warm-up")
    copy_warmup_steps: int = opt(0, "steps of a random-token copy task before SFT, so a model trained from "
                                    "scratch grows the induction heads that copy names from the task", ge=0)
    renamed_copies: int = opt(0, "behaviour cloning: copies of each walkthrough with the taken object renamed to a "
                                 "made-up word, so a model trained from scratch learns to copy names from the "
                                 "task instead of memorizing them", ge=0)
    rename_names: Literal["made_up", "textworld"] = opt(
        "made_up", "renamed copies: new names are made-up words, or the names of portable things in TextWorld's "
                   "own grammar (the engine's vocabulary; then the tokenizer is trained on the copies too)")


@dataclass
class CollectConfig:
    tasks: int = opt(180, "stage 1: tasks rolled out with the base policy", ge=1)
    rollouts_per_task: int = opt(8, "stage 1: trajectories per task", ge=1)
    out: str | None = opt(None, "output folder of trajectories and skill labels; null = <run_dir>/collect")


@dataclass
class LogConfig:
    tensorboard: bool = opt(True, "each step's scalars as TensorBoard events, SFT's in <run_dir>/tb/sft, RL's in "
                                  "<run_dir>/tb (the demo's: <run_dir>/<algorithm>/tb); needs the tensorboard "
                                  "package (the report extra), else none are written")
    wandb_project: str | None = opt(None, "Weights & Biases project of SFT's and RL's step metrics, one W&B run "
                                          "each; null = off")
    progress: bool = opt(True, "a progress bar of SFT's optimizer steps and of RL's updates, on stderr when it is "
                               "a terminal")


@dataclass
class DemoConfig:
    algorithms: list[Algorithm] = opt(["grpo", "seed"], "algorithms the demo trains and compares")
    lanes: int = opt(2, "processes that run the jobs after SFT side by side (each algorithm's run, the control, the "
                        "SFT policy's evaluation), each with its share of the CPUs (app/demo_jobs.py)", ge=1)


@dataclass
class Config:
    run: RunConfig = section(RunConfig, "run identity")
    algorithm: Algorithm = opt("seed", "RL algorithm")
    model: ModelConfig = section(ModelConfig, "policy model")
    env: EnvConfig = section(EnvConfig, "environment")
    rollout: RolloutConfig = section(RolloutConfig, "rollout")
    skill: SkillConfig = section(SkillConfig, "skills and analyzers")
    loss: LossConfig = section(LossConfig, "loss")
    grsd: GRSDConfig = section(GRSDConfig, "GRSD")
    optim: OptimConfig = section(OptimConfig, "optimizer of RL, and of SFT where an option says so")
    trainer: TrainerConfig = section(TrainerConfig, "trainer")
    dist: DistConfig = section(DistConfig, "scale-out over torchrun processes (FSDP2, tensor parallel)")
    sft: SFTConfig = section(SFTConfig, "supervised fine-tuning")
    collect: CollectConfig = section(CollectConfig, "stage-1 collection")
    log: LogConfig = section(LogConfig, "logging of the commands that train: sft, train, demo")
    demo: DemoConfig = section(DemoConfig, "CPU demo")

    @property
    def run_dir(self) -> Path:
        return Path(self.run.out_dir) / self.run.name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return dump_yaml(self.to_dict())

    def save(self, path: str | Path | None = None) -> Path:
        """Write the resolved config (default: <run_dir>/config.yaml) and return its path."""
        out = Path(path) if path is not None else self.run_dir / CONFIG_FILE
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(self.to_yaml())
        return out
