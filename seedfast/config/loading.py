"""Loading the run configuration: YAML files, dotted command-line overrides, validation, clear errors.

    cfg = load_config("configs/demo_cpu.yaml", ["trainer.steps=3", "algorithm=grpo"])
    cfg.to_yaml()            # the resolved config, as a run writes it to runs/<name>/config.yaml

The schema itself (schema.py) is walked here: `options()` lists every field with its default and the doc that
`seedfast <cmd> --help` prints. Numbers and enums are checked here, once, so that no run starts with a value it
would trip on later.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import re
import types
import typing
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from seedfast.config.schema import (
    ALFWORLD_TASK_TYPES,
    CONFIG_FILE,
    SCIENCEWORLD_SIMPLIFICATIONS,
    SCIENCEWORLD_TASKS,
    TEXTWORLD_GAME_TYPES,
    Config,
    ConfigError,
    ConfigWarning,
    LoRAConfig,
    _parse_step_range,
)
from seedfast.config.yaml_io import load_yaml


def parse_yaml(text: str, source: str = "<string>") -> Any:
    try:
        return load_yaml(text)
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
        if not math.isfinite(value):  # 1e400 reads as inf: no setting means infinity or NaN
            hint = " (a literal beyond ±1.8e308 reads as infinity)" if math.isinf(value) else ""
            raise ConfigError(f"{key}: must be a finite number, got {format_value(value)}{hint}{source}")
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


def _warn(message: str, stacklevel: int = 3) -> None:
    warnings.warn(message, ConfigWarning, stacklevel=stacklevel)


def _require_external(cfg: Config, why: str) -> None:
    for name in ("endpoint", "model"):
        if getattr(cfg.skill.external, name) in (None, ""):
            raise ConfigError(f"skill.external.{name} is required: {why}")


# What each algorithm needs of the config, one check per value of `algorithm` (ALGORITHM_CHECKS below; None: the
# algorithm needs nothing beyond what validate checks for every run). The trainer's table of what each algorithm
# does (seedfast/train/algorithms.py) refuses to load unless both tables name the schema's algorithms, so a new
# algorithm is listed here even when it has nothing to check.


def _check_opd(cfg: Config) -> None:
    """SEED and SDAR: the OPD term and the analyzer that writes its skills."""
    if cfg.loss.opd_coef == 0:
        # _warn, this, the algorithm's check, validate: the warning points at validate's caller, as its own do
        _warn(f"algorithm={cfg.algorithm} with loss.opd_coef=0 trains plain GRPO", stacklevel=5)
    if cfg.skill.analyzer == "external":
        _require_external(cfg, f"algorithm={cfg.algorithm} with skill.analyzer=external")


def _check_seed(cfg: Config) -> None:
    _check_opd(cfg)


def _check_sdar(cfg: Config) -> None:
    _check_opd(cfg)
    if cfg.skill.library is None and cfg.skill.analyzer == "self":
        raise ConfigError("algorithm=sdar needs a static skill provider: set skill.library (a skill library file) "
                          "or skill.analyzer=oracle|external")


def _check_grsd(cfg: Config) -> None:
    if cfg.grsd.judge == "external":
        _require_external(cfg, "algorithm=grsd scores reflections with grsd.judge=external")


ALGORITHM_CHECKS: dict[str, Callable[[Config], None] | None] = {
    "grpo": None,  # plain GRPO: no OPD term, no analyzer, no judge
    "seed": _check_seed,
    "sdar": _check_sdar,
    "grsd": _check_grsd,
}


def _check_scienceworld(env: Any) -> None:
    """env.scienceworld: task ids become names, every name is one of the 30, the simplifications are known, and a
    simulator step's deadline falls before the worker pool's."""
    sw = env.scienceworld
    by_id = dict(SCIENCEWORLD_TASKS)
    names = [by_id.get(t.strip(), t.strip()) for t in sw.tasks]
    if not names:
        raise ConfigError("env.scienceworld.tasks: name at least one task (`seedfast envs list scienceworld`)")
    for name in names:
        if name not in by_id.values():
            raise ConfigError(f"env.scienceworld.tasks: unknown ScienceWorld task {name!r}; choose names or ids of: "
                              + ", ".join(f"{n} ({i})" for i, n in SCIENCEWORLD_TASKS))
    if len(set(names)) != len(names):
        raise ConfigError(f"env.scienceworld.tasks: a task is named twice in {format_value(sw.tasks)}")
    sw.tasks = names
    items = [s.strip() for s in sw.simplifications.split(",") if s.strip()]
    for item in items:
        if item not in SCIENCEWORLD_SIMPLIFICATIONS:
            raise ConfigError(f"env.scienceworld.simplifications: unknown simplification {item!r}; choose from "
                              f"{', '.join(SCIENCEWORLD_SIMPLIFICATIONS)} (comma-separated)")
    if "noElectricalAction" in items and any("power-component" in n or "conductivity" in n for n in names):
        raise ConfigError("env.scienceworld.simplifications: noElectricalAction with an electrical task "
                          "(power-component*, *conductivity*); 'easy' leaves it out for those tasks by itself")
    sw.simplifications = ",".join(items)
    if sw.call_timeout_s >= env.step_timeout_s:
        raise ConfigError(f"env.scienceworld.call_timeout_s={sw.call_timeout_s:g} must be below env.step_timeout_s="
                          f"{env.step_timeout_s:g}: the environment fails a hung step before the pool kills its "
                          "worker")


def _check_lora(cfg: Config) -> None:
    lora = cfg.model.lora
    every = LoRAConfig().targets  # the default adapts every linear layer of a block (model/lora.py LORA_TARGETS)
    unknown = [t for t in lora.targets if t not in every]
    if unknown or not lora.targets or len(set(lora.targets)) != len(lora.targets):
        raise ConfigError(f"model.lora.targets: expected distinct names among {every}, got "
                          f"{format_value(lora.targets)}")
    if lora.adapter is not None and not (Path(lora.adapter) / "adapter_config.json").is_file():
        raise ConfigError(f"model.lora.adapter={lora.adapter!r} is not a PEFT adapter folder (no adapter_config.json)")


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

    if cfg.rollout.vllm_dtype is not None and cfg.rollout.engine != "vllm":
        raise ConfigError(f"rollout.vllm_dtype={cfg.rollout.vllm_dtype} is for rollout.engine=vllm; the own engine "
                          "samples the trained policy in model.dtype")

    env = cfg.env
    allowed = TEXTWORLD_GAME_TYPES if env.kind == "textworld" else ALFWORLD_TASK_TYPES
    if env.kind != "scienceworld" and env.game_type not in allowed:
        raise ConfigError(f"env.game_type: {env.game_type!r} is not a {env.kind} game type; choose one of: "
                          f"{', '.join(allowed)}")
    if env.kind == "scienceworld":
        _check_scienceworld(env)
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
    rollout_max = cfg.rollout.max_prompt_length + cfg.rollout.max_response_tokens
    if cfg.rollout.vllm_max_model_len is not None and cfg.rollout.vllm_max_model_len < rollout_max:
        raise ConfigError(f"rollout.vllm_max_model_len={cfg.rollout.vllm_max_model_len} is below the longest rollout "
                          f"sequence (rollout.max_prompt_length + rollout.max_response_tokens = {rollout_max})")
    if cfg.rollout.engine == "vllm" and command not in (None, "collect", "train", "config"):
        raise ConfigError(f"rollout.engine=vllm: `seedfast {command}` samples with the own engine (vLLM serves "
                          "`seedfast collect` and the rollouts of `seedfast train`); set rollout.engine=own")
    if cfg.trainer.eval_repeats > 1 and cfg.rollout.eval_temperature == 0:
        raise ConfigError(f"trainer.eval_repeats={cfg.trainer.eval_repeats} with rollout.eval_temperature=0: a greedy "
                          "evaluation replays the same episode; set trainer.eval_repeats=1 or sample")
    if cfg.optim.master_dtype not in ("fp32", cfg.model.dtype):
        raise ConfigError(f"optim.master_dtype={cfg.optim.master_dtype} with model.dtype={cfg.model.dtype}: master "
                          "weights are fp32 or the compute dtype itself (docs/scaling.md, 'Precision')")
    if cfg.optim.master_dtype != "fp32":
        _warn(f"optim.master_dtype={cfg.optim.master_dtype}: the trained weights and AdamW states are "
              f"{cfg.optim.master_dtype}, so an update much smaller than a weight's ulp (optim.lr={cfg.optim.lr:g}) "
              "rounds away; the run warns with the share that does at its first step")
    _check_lora(cfg)
    if cfg.rollout.lora_sync == "adapter" and cfg.rollout.engine == "vllm" and cfg.model.lora.rank > 512:
        raise ConfigError(f"rollout.lora_sync=adapter with rollout.engine=vllm: vLLM serves LoRA ranks up to 512, "
                          f"model.lora.rank is {cfg.model.lora.rank}; set rollout.lora_sync=merged")
    corr = cfg.rollout.correction
    for low, high in (("geo_low", "geo_high"), ("token_low", "token_high")):
        if getattr(corr, low) > getattr(corr, high):
            raise ConfigError(f"rollout.correction.{low}={getattr(corr, low):g} is above rollout.correction.{high}="
                              f"{getattr(corr, high):g}: the kept range [{low}, {high}] would be empty")
    if len(set(cfg.demo.algorithms)) != len(cfg.demo.algorithms) or not cfg.demo.algorithms:
        raise ConfigError(f"demo.algorithms: expected distinct algorithms, got {format_value(cfg.demo.algorithms)}")

    if cfg.rollout.n < 2:
        _warn(f"rollout.n={cfg.rollout.n}: a group of one trajectory has no baseline, so every GRPO "
              "advantage is 0 and only the KL/entropy/OPD terms train")
    check = ALGORITHM_CHECKS[cfg.algorithm]
    if check is not None:
        check(cfg)
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


BASE_KEY = "base"


def merge_configs(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`: sections (mappings) merge key by key, any other value (a list too) replaces the
    base's; an empty section in `over` (`dist:` with nothing under it) sets nothing, as it does in a file."""
    merged = dict(base)
    for key, value in over.items():
        below = merged.get(key)
        if isinstance(below, Mapping) and isinstance(value, Mapping):
            merged[key] = merge_configs(below, value)
        elif not (isinstance(below, Mapping) and value is None):
            merged[key] = value
    return merged


def read_config_file(path: Path, _including: tuple[Path, ...] = ()) -> tuple[Any, list[Path]]:
    """A YAML config file's mapping with its `base:` chain merged in, and the files read (this one first).

    `base: <path>` at the top of a file names another config file, relative to the including file's folder;
    that file is read first (it may have a base of its own) and this one's keys win (merge_configs).
    """
    if path.resolve() in [p.resolve() for p in _including]:
        chain = " -> ".join(str(p) for p in (*_including, path))
        raise ConfigError(f"config files include each other in a cycle: {chain}")
    if not path.is_file():
        by = f" (the {BASE_KEY} of {_including[-1]})" if _including else ""
        raise ConfigError(f"config file not found: {path}{by}")
    data = parse_yaml(path.read_text(), str(path))
    if not isinstance(data, Mapping) or BASE_KEY not in data:
        return data, [path]
    ref = data[BASE_KEY]
    if not isinstance(ref, str) or not ref:
        raise ConfigError(f"{BASE_KEY}: expected the path of a config file, relative to {path.parent}, got "
                          f"{format_value(ref)!r} (in {path})")
    base, files = read_config_file(path.parent / ref, (*_including, path))
    if not isinstance(base, Mapping):
        raise ConfigError(f"config: expected a mapping of keys, got {format_value(base)!r} (in {files[0]}, the "
                          f"{BASE_KEY} of {path})")
    return merge_configs(base, {k: v for k, v in data.items() if k != BASE_KEY}), [path, *files]


def load_config(path: str | Path | None = None, overrides: Sequence[str] = (),
                command: str | None = None) -> Config:
    """Defaults <- YAML file (or a run folder's config.yaml) and its bases <- dotted overrides; validated."""
    cfg = Config()
    if path is not None:
        path = Path(path)
        if path.is_dir():
            path = path / CONFIG_FILE
        data, files = read_config_file(path)
        bases = f", based on {', '.join(map(str, files[1:]))}" if files[1:] else ""
        _assign(cfg, data or {}, "", f" (in {path}{bases})")
    return apply_overrides(cfg, overrides, command)
