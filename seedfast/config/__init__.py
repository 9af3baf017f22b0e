"""Run configuration: a dataclass schema, YAML files, dotted command-line overrides, clear errors.

    cfg = load_config("configs/demo_cpu.yaml", ["trainer.steps=3", "algorithm=grpo"])
    cfg.to_yaml()            # the resolved config, as a run writes it to runs/<name>/config.yaml

    schema.py   Config and its section dataclasses, every field with its default (docs/algorithms.md, 'Defaults')
                and a one-line doc; ConfigError, ConfigWarning
    yaml_io.py  the YAML dialect (YAML 1.2 scalars, flow-style leaf lists), read and written
    loading.py  YAML parsing (errors name the source), the option walk (`options()`, --help), dotted overrides, type
                and bound checks, validate, load_config
"""

from seedfast.config.loading import (
    Option,
    _assign,
    _check_bounds,
    _coerce,
    apply_overrides,
    config_from_dict,
    format_value,
    load_config,
    option_keys,
    options,
    options_help,
    parse_overrides,
    parse_yaml,
    type_name,
    validate,
)
from seedfast.config.schema import (
    ALFWORLD_TASK_TYPES,
    CONFIG_FILE,
    SCIENCEWORLD_SIMPLIFICATIONS,
    SCIENCEWORLD_TASKS,
    TEXTWORLD_GAME_TYPES,
    Algorithm,
    CollectConfig,
    Config,
    ConfigError,
    ConfigWarning,
    CorrectionConfig,
    DemoConfig,
    EnvConfig,
    ExternalAnalyzerConfig,
    GRSDConfig,
    LogConfig,
    LossConfig,
    ModelConfig,
    OptimConfig,
    RolloutConfig,
    RunConfig,
    ScienceWorldConfig,
    SFTConfig,
    SkillConfig,
    TinyModelConfig,
    TrainerConfig,
    _parse_levels,
    _parse_step_range,
    opt,
    section,
)
from seedfast.config.yaml_io import _Dumper, _Loader

__all__ = [
    "ALFWORLD_TASK_TYPES", "CONFIG_FILE", "SCIENCEWORLD_SIMPLIFICATIONS", "SCIENCEWORLD_TASKS", "ScienceWorldConfig",
    "TEXTWORLD_GAME_TYPES", "Algorithm", "CollectConfig", "Config", "ConfigError",
    "ConfigWarning", "CorrectionConfig", "DemoConfig", "EnvConfig", "ExternalAnalyzerConfig", "GRSDConfig", "LogConfig",
    "LossConfig",
    "ModelConfig", "OptimConfig", "Option", "RolloutConfig", "RunConfig", "SFTConfig", "SkillConfig",
    "TinyModelConfig", "TrainerConfig", "apply_overrides", "config_from_dict", "format_value", "load_config", "opt",
    "option_keys", "options", "options_help", "parse_overrides", "parse_yaml", "section", "type_name", "validate",
    # private, kept importable from seedfast.config for tests and debugging
    "_Dumper", "_Loader", "_assign", "_check_bounds", "_coerce", "_parse_levels", "_parse_step_range",
]
