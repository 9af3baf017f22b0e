"""Run configuration: a dataclass schema, YAML files, dotted command-line overrides, clear errors.

    cfg = load_config("configs/demo_cpu.yaml", ["trainer.steps=3", "algorithm=grpo"])
    cfg.to_yaml()            # the resolved config, as a run writes it to runs/<name>/config.yaml

Every field carries its default (docs/algorithms.md, 'Defaults') and a one-line doc that `seedfast <cmd> --help` prints.
Numbers and enums are checked here, once, so that no run starts with a value it would trip on later.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import re
import types
import typing
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml


class ConfigError(ValueError):
    """A config value or key that a run cannot use; the message names the key."""


class ConfigWarning(UserWarning):
    """A legal but suspicious setting (e.g. groups of one trajectory)."""


Algorithm = Literal["grpo", "sdar", "seed", "grsd"]
TEXTWORLD_GAME_TYPES = ("treasure_hunter", "coin_collector", "cooking")
ALFWORLD_TASK_TYPES = (
    "all", "pick_and_place", "pick_clean_then_place", "pick_heat_then_place",
    "pick_cool_then_place", "look_at_obj", "pick_two_obj",
)


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
class ModelConfig:
    path: str | None = opt(None, "HF model folder (config.json + safetensors); null = tiny decoder of model.tiny")
    tokenizer: str | None = opt(None, "tokenizer folder; null = model.path, or <run_dir>/tokenizer for tiny")
    ref_path: str | None = opt(None, "reference policy for the KL term; null = the policy the RL run starts from")
    dtype: Literal["bf16", "fp16", "fp32"] = opt("bf16", "parameter and compute dtype")
    attn_backend: Literal["auto", "flash", "sdpa", "flex"] = opt(
        "auto", "attention kernel; auto = flash-attn varlen on CUDA when installed, else FlexAttention on CUDA, "
        "sdpa on CPU (flex has no backward on CPU)")
    tiny: TinyModelConfig = section(TinyModelConfig, "from-scratch decoder used when model.path is null")


@dataclass
class EnvConfig:
    kind: Literal["textworld", "alfworld"] = opt("textworld", "environment family")
    game_type: str = opt("treasure_hunter", "TextWorld challenge, or ALFWorld task type ('all')")
    levels: list[int] = opt([1, 2, 3, 4, 5], "TextWorld difficulty levels: a list or a range like 3-6",
                            parse=_parse_levels)
    n_train: int | None = opt(16, "TextWorld: training games per level; ALFWorld: games, null = all", ge=1)
    n_eval: int | None = opt(8, "TextWorld: held-out games per level; ALFWorld: games, null = all", ge=1)
    games_dir: str = opt("games", "where games are generated (TextWorld) or read from (ALFWorld data)")
    games_seed: int = opt(0, "first seed of game generation, apart from run.seed so game pools stay fixed", ge=0)
    workers: int = opt(0, "processes used to generate games; 0 = all CPUs", ge=0)
    max_steps: int = opt(50, "environment steps per episode before it counts as failed", ge=1)
    history_k: int = opt(5, "past (observation, action) pairs kept in each step prompt", ge=0)
    invalid_penalty: float = opt(0.1, "reward subtracted at a step whose action is invalid", ge=0)
    step_timeout_s: float = opt(30.0, "seconds one environment step may take", gt=0)
    isolation: Literal["process", "inline"] = opt(
        "process", "process = one worker process per slot (timeouts, crash recovery); inline = in this process")
    slots: int = opt(0, "environments stepped at once during rollout; 0 = tasks_per_batch x n", ge=0)


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
    gate: Literal["gap", "entropy", "soft_or"] = opt("gap", "OPD gate")
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
    weight_decay: float = opt(0.01, "AdamW weight decay", ge=0)
    grad_clip: float | None = opt(1.0, "global gradient-norm clip; null = off", gt=0)
    betas: list[float] = opt([0.9, 0.999], "AdamW betas")
    eps: float = opt(1e-8, "AdamW epsilon", gt=0)
    warmup_steps: int = opt(0, "linear warm-up updates", ge=0)
    schedule: Literal["constant", "cosine"] = opt("constant", "learning-rate schedule after warm-up")
    min_lr_ratio: float = opt(0.0, "cosine floor as a fraction of lr", ge=0, le=1)


@dataclass
class TrainerConfig:
    steps: int = opt(150, "RL updates", ge=1)
    ppo_epochs: int = opt(1, "passes over each batch", ge=1)
    mini_batches: int = opt(1, "optimizer steps per epoch (the batch is split into this many)", ge=1)
    micro_batch_tokens: int = opt(16384, "packed tokens per forward/backward (a sample is never split)", ge=1)
    eval_every: int = opt(10, "evaluate every this many updates; 0 = only at the end", ge=0)
    eval_games: int | None = opt(None, "eval games per evaluation; null = env.n_eval", ge=1)
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
class SFTConfig:
    epochs: int = opt(3, "passes over the SFT data", ge=1)
    lr: float = opt(5e-6, "learning rate of SFT", gt=0)
    batch_tokens: int = opt(16384, "packed tokens per optimizer step", ge=1)
    weight_decay: float = opt(0.0, "AdamW weight decay of SFT", ge=0)
    warmup_steps: int = opt(0, "linear warm-up optimizer steps", ge=0)
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
    tensorboard: bool = opt(True, "write TensorBoard events to <run_dir>/tb")
    wandb_project: str | None = opt(None, "Weights & Biases project; null = off")
    progress: bool = opt(True, "progress bars on the terminal")


@dataclass
class DemoConfig:
    algorithms: list[Algorithm] = opt(["grpo", "seed"], "algorithms the demo trains and compares")


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
    optim: OptimConfig = section(OptimConfig, "optimizer")
    trainer: TrainerConfig = section(TrainerConfig, "trainer")
    sft: SFTConfig = section(SFTConfig, "supervised fine-tuning")
    collect: CollectConfig = section(CollectConfig, "stage-1 collection")
    log: LogConfig = section(LogConfig, "logging")
    demo: DemoConfig = section(DemoConfig, "CPU demo")

    @property
    def run_dir(self) -> Path:
        return Path(self.run.out_dir) / self.run.name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.dump(self.to_dict(), Dumper=_Dumper, sort_keys=False, allow_unicode=True)

    def save(self, path: str | Path | None = None) -> Path:
        """Write the resolved config (default: <run_dir>/config.yaml) and return its path."""
        out = Path(path) if path is not None else self.run_dir / "config.yaml"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(self.to_yaml())
        return out


# ----------------------------------------------------------------------------------- YAML dialect


class _Loader(yaml.SafeLoader):
    """YAML 1.2 scalars: `1e-6` is a float, `yes`/`on` stay strings, `5:7` is not base-60."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers
            if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?[0-9]+$"), list("-+0123456789"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
               r"|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


class _Dumper(yaml.SafeDumper):
    """Leaf lists in flow style (`levels: [3, 4]`), the way people write them."""


_Dumper.add_representer(list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def parse_yaml(text: str, source: str = "<string>") -> Any:
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {e}") from None


# ------------------------------------------------------------------------------ walking the schema


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _is_section(obj: Any, name: str) -> bool:
    return dataclasses.is_dataclass(getattr(obj, name))


@dataclass(frozen=True)
class Option:
    key: str
    type: Any
    default: Any
    doc: str
    choices: tuple[Any, ...] | None


def _leaves(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any, dataclasses.Field, Any]]:
    """(dotted key, owning dataclass, field, type hint) for every leaf, in schema order."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        if _is_section(obj, f.name):
            yield from _leaves(getattr(obj, f.name), f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", obj, f, hints[f.name]


def _choices(tp: Any) -> tuple[Any, ...] | None:
    for t in (tp, *get_args(tp)):
        if get_origin(t) is Literal:
            return get_args(t)
        if get_origin(t) is list:
            return _choices(get_args(t)[0])
    return None


def options() -> list[Option]:
    """Every config option with its default and doc, in schema order."""
    return [Option(key, tp, getattr(owner, f.name), f.metadata["doc"], _choices(tp))
            for key, owner, f, tp in _leaves(Config())]


def option_keys() -> list[str]:
    return [o.key for o in options()]


def format_value(value: Any) -> str:
    """A value as it is written in YAML and in overrides."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    return str(value)


def type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return "|".join(str(c) for c in get_args(tp))
    if get_origin(tp) in (Union, types.UnionType):
        return " or ".join("null" if a is type(None) else type_name(a) for a in get_args(tp))
    if get_origin(tp) is list:
        return f"list of {type_name(get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp))


def options_help() -> str:
    """The option table for --help: `key = default  doc [choices]`, grouped by section."""
    opts = options()
    width = max(len(f"{o.key} = {format_value(o.default)}") for o in opts) + 2
    lines, section_name = [], None
    for o in opts:
        head = o.key.split(".")[0] if "." in o.key else ""
        if head != section_name:
            section_name = head
            lines.append("")
        choices = f" [{'|'.join(map(str, o.choices))}]" if o.choices else ""
        lines.append(f"  {f'{o.key} = {format_value(o.default)}':<{width}}{o.doc}{choices}")
    return "\n".join(lines).lstrip("\n")


# ---------------------------------------------------------------------------------- setting values


def _suggest(key: str) -> str:
    keys = option_keys()
    sections = sorted({k.rsplit(".", 1)[0] for k in keys if "." in k})
    leaf = key.rsplit(".", 1)[-1]
    same_leaf = [k for k in keys if k.rsplit(".", 1)[-1] == leaf]
    match = same_leaf[:1] or difflib.get_close_matches(key, keys + sections, n=1, cutoff=0.6)
    if not match:
        by_leaf = {k.rsplit(".", 1)[-1]: k for k in reversed(keys)}
        close = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.7)
        match = [by_leaf[c] for c in close]
    return f" (did you mean '{match[0]}'?)" if match else ""


def _unknown(key: str, source: str) -> ConfigError:
    return ConfigError(f"unknown config key '{key}'{_suggest(key)}{source}")


def _type_error(key: str, value: Any, tp: Any, source: str) -> ConfigError:
    shown = format_value(value) if value is None or isinstance(value, bool) else repr(value)
    hint = " (write true or false)" if tp is bool and str(value).lower() in ("yes", "no", "on", "off") else ""
    return ConfigError(f"{key}: expected {type_name(tp)}, got {shown} ({type(value).__name__}){hint}{source}")


def _check_bounds(key: str, value: Any, meta: Mapping[str, Any], source: str) -> None:
    gt, ge, lt, le = (meta.get(b) for b in ("gt", "ge", "lt", "le"))
    if (gt is not None and not value > gt) or (ge is not None and not value >= ge) or \
       (lt is not None and not value < lt) or (le is not None and not value <= le):
        low = f"({gt}" if gt is not None else f"[{ge}" if ge is not None else "(-inf"
        high = f"{lt})" if lt is not None else f"{le}]" if le is not None else "inf)"
        raise ConfigError(f"{key}: must be in {low}, {high}, got {format_value(value)}{source}")


def _coerce(key: str, value: Any, tp: Any, meta: Mapping[str, Any], source: str = "",
            expected: Any = None) -> Any:
    """Check `value` against the type hint `tp` (and bounds); return it normalized (int -> float etc)."""
    origin = get_origin(tp)
    expected = tp if expected is None else expected
    if origin in (Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        if value is None and len(inner) < len(get_args(tp)):
            return None
        if len(inner) != 1:
            raise TypeError(f"schema type {tp} of {key} is not supported")
        if value is None:
            raise _type_error(key, value, expected, source)
        return _coerce(key, value, inner[0], meta, source, expected=tp)
    if origin is Literal:
        allowed = get_args(tp)
        if isinstance(value, str) and value in allowed:
            return value
        hint = difflib.get_close_matches(str(value).lower(), [str(a) for a in allowed], n=1, cutoff=0.5)
        did_you_mean = f" (did you mean '{hint[0]}'?)" if hint else ""
        raise ConfigError(f"{key}: {format_value(value)!r} is not allowed; choose one of: "
                          f"{', '.join(map(str, allowed))}{did_you_mean}{source}")
    if origin is list:
        if meta.get("parse"):
            value = meta["parse"](value)
        if not isinstance(value, (list, tuple)):
            raise _type_error(key, value, expected, source)
        return [_coerce(f"{key}[{i}]", v, get_args(tp)[0], {}, source) for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            raise _type_error(key, value, expected, source)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(key, value, expected, source)
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _type_error(key, value, expected, source)
        value = float(value)
    elif tp is str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise _type_error(key, value, expected, source)
        return str(value)
    else:
        raise TypeError(f"schema type {tp} of {key} is not supported")
    _check_bounds(key, value, meta, source)
    return value


def _assign(obj: Any, data: Mapping[str, Any], prefix: str, source: str) -> None:
    """Set the fields of dataclass `obj` from a nested mapping, checking every key and value."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping of keys, got "
                          f"{format_value(data)!r}{source}")
    names = {f.name: f for f in dataclasses.fields(obj)}
    for name, value in data.items():
        key = f"{prefix}{name}"
        if not isinstance(name, str) or name not in names:
            deeper = value
            while isinstance(deeper, Mapping) and len(deeper) == 1:
                sub, deeper = next(iter(deeper.items()))
                key = f"{key}.{sub}"
            raise _unknown(key, source)
        if _is_section(obj, name):
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise ConfigError(f"{key} is a section, not a value: set {key}.<field> (got "
                                  f"{format_value(value)!r}){source}")
            _assign(getattr(obj, name), value, f"{key}.", source)
        else:
            f = names[name]
            setattr(obj, name, _coerce(key, value, _hints(type(obj))[name], f.metadata, source))


def parse_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """`["trainer.steps=150", "rollout.n=8"]` -> a nested mapping; values are parsed as YAML scalars."""
    if isinstance(overrides, str):
        raise TypeError("overrides must be a list of 'key=value' strings, not one string")
    nested: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", key):
            raise ConfigError(f"override {item!r} must look like key=value, e.g. trainer.steps=150")
        value = parse_yaml(raw, f"override {item!r}")
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = value
    return nested


# --------------------------------------------------------------------------------------- validation


def _parse_step_range(key: str, text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if not m or int(m.group(1)) > int(m.group(2)):
        raise ConfigError(f"{key}: expected A:B with 0 <= A <= B (steps A through B), got {text!r}")
    return int(m.group(1)), int(m.group(2))


def _warn(message: str) -> None:
    warnings.warn(message, ConfigWarning, stacklevel=3)


def _require_external(cfg: Config, why: str) -> None:
    for name in ("endpoint", "model"):
        if getattr(cfg.skill.external, name) in (None, ""):
            raise ConfigError(f"skill.external.{name} is required: {why}")


def validate(cfg: Config, command: str | None = None) -> Config:
    """Check every value (also ones set in code) and the rules that tie fields together.

    `command` adds the checks only that command needs (e.g. `collect` with an external analyzer
    needs its endpoint). Raises ConfigError; legal but suspicious settings give a ConfigWarning.
    """
    if not isinstance(cfg, Config):
        raise TypeError(f"cfg must be a seedfast Config, got {type(cfg).__name__}")
    for key, owner, f, tp in _leaves(cfg):
        setattr(owner, f.name, _coerce(key, getattr(owner, f.name), tp, f.metadata))

    tiny = cfg.model.tiny
    if cfg.model.path is None:
        if tiny.hidden % tiny.heads:
            raise ConfigError(f"model.tiny.hidden={tiny.hidden} must be a multiple of model.tiny.heads={tiny.heads}")
        if tiny.heads % tiny.kv_heads:
            raise ConfigError(f"model.tiny.kv_heads={tiny.kv_heads} must divide model.tiny.heads={tiny.heads}")
        if cfg.rollout.engine == "vllm":
            raise ConfigError("rollout.engine=vllm needs an HF model folder in model.path; "
                              "the tiny decoder runs on rollout.engine=own")

    env = cfg.env
    allowed = TEXTWORLD_GAME_TYPES if env.kind == "textworld" else ALFWORLD_TASK_TYPES
    if env.game_type not in allowed:
        raise ConfigError(f"env.game_type: {env.game_type!r} is not a {env.kind} game type; choose one of: "
                          f"{', '.join(allowed)}")
    if env.kind == "textworld":
        if not env.levels or min(env.levels) < 1:
            raise ConfigError(f"env.levels: expected levels >= 1, got {format_value(env.levels)}")
        if env.n_train is None or env.n_eval is None:
            raise ConfigError("env.n_train and env.n_eval must be numbers for textworld (games are generated)")

    if len(cfg.optim.betas) != 2 or not all(0 <= b < 1 for b in cfg.optim.betas):
        raise ConfigError(f"optim.betas: expected two numbers in [0, 1), got {format_value(cfg.optim.betas)}")
    if cfg.trainer.profile_steps is not None:
        _parse_step_range("trainer.profile_steps", cfg.trainer.profile_steps)
    sample_max = cfg.rollout.max_prompt_length + cfg.skill.max_skill_tokens + cfg.rollout.max_response_tokens
    if cfg.trainer.micro_batch_tokens < sample_max:
        raise ConfigError(f"trainer.micro_batch_tokens={cfg.trainer.micro_batch_tokens} is below the longest "
                          f"sample (rollout.max_prompt_length + skill.max_skill_tokens + "
                          f"rollout.max_response_tokens = {sample_max})")
    if cfg.rollout.engine == "vllm" and command not in (None, "collect", "config"):
        raise ConfigError(f"rollout.engine=vllm: `seedfast {command}` samples with the own engine (vLLM serves "
                          "`seedfast collect` only: the RL loop has no weight sync to a vLLM server yet); "
                          "set rollout.engine=own")
    if len(set(cfg.demo.algorithms)) != len(cfg.demo.algorithms) or not cfg.demo.algorithms:
        raise ConfigError(f"demo.algorithms: expected distinct algorithms, got {format_value(cfg.demo.algorithms)}")

    if cfg.rollout.n < 2:
        _warn(f"rollout.n={cfg.rollout.n}: a group of one trajectory has no baseline, so every GRPO "
              "advantage is 0 and only the KL/entropy/OPD terms train")
    algo = cfg.algorithm
    if algo in ("seed", "sdar"):
        if cfg.loss.opd_coef == 0:
            _warn(f"algorithm={algo} with loss.opd_coef=0 trains plain GRPO")
        if cfg.skill.analyzer == "external":
            _require_external(cfg, f"algorithm={algo} with skill.analyzer=external")
    if algo == "sdar" and cfg.skill.library is None and cfg.skill.analyzer == "self":
        raise ConfigError("algorithm=sdar needs a static skill provider: set skill.library (a skill library file) "
                          "or skill.analyzer=oracle|external")
    if algo == "grsd" and cfg.grsd.judge == "external":
        _require_external(cfg, "algorithm=grsd scores reflections with grsd.judge=external")
    if command == "collect" and cfg.skill.collect_analyzer == "external":
        _require_external(cfg, "seedfast collect labels trajectories with skill.collect_analyzer=external")
    return cfg


# ------------------------------------------------------------------------------------------ loading


def config_from_dict(data: Mapping[str, Any] | None, source: str = "") -> Config:
    """A validated Config from a nested mapping (missing keys keep their defaults)."""
    cfg = Config()
    _assign(cfg, data or {}, "", f" (in {source})" if source else "")
    return validate(cfg)


def apply_overrides(cfg: Config, overrides: Sequence[str], command: str | None = None) -> Config:
    """A validated copy of `cfg` with dotted overrides applied; `cfg` itself is not changed."""
    new = copy.deepcopy(cfg)
    for item in overrides:
        _assign(new, parse_overrides([item]), "", f" (from override {item!r})")
    return validate(new, command)


def load_config(path: str | Path | None = None, overrides: Sequence[str] = (),
                command: str | None = None) -> Config:
    """Defaults <- YAML file (or a run folder's config.yaml) <- dotted overrides; validated (see validate)."""
    cfg = Config()
    if path is not None:
        path = Path(path)
        if path.is_dir():
            path = path / "config.yaml"
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        data = parse_yaml(path.read_text(), str(path))
        _assign(cfg, data or {}, "", f" (in {path})")
    return apply_overrides(cfg, overrides, command)
