"""seedfast.config: the defaults of docs/algorithms.md, YAML + dotted overrides, every kind of error, round trip."""

import dataclasses
import warnings
from pathlib import Path

import pytest

from seedfast.config import (
    Config,
    ConfigError,
    ConfigWarning,
    apply_overrides,
    config_from_dict,
    load_config,
    option_keys,
    options,
    options_help,
    parse_overrides,
    parse_yaml,
    validate,
)
from seedfast.config.loading import format_value, merge_configs, read_config_file

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def load(*overrides: str) -> Config:
    return load_config(None, list(overrides))


def test_defaults_are_the_spec_values():
    c = Config()
    spec = {  # docs/algorithms.md, 'Defaults' and 'SEED', written out by hand
        "env.history_k": 5, "env.invalid_penalty": 0.1, "rollout.n": 8, "rollout.tasks_per_batch": 16,
        "rollout.temperature": 1.0, "rollout.eval_temperature": 0.4, "rollout.max_prompt_length": 2048,
        "rollout.max_response_tokens": 512, "loss.clip_low": 0.2, "loss.clip_high": 0.2, "loss.dual_clip": 3.0,
        "loss.kl_coef": 0.01, "loss.kl_kind": "low_var_kl", "loss.entropy_coef": 0.001, "loss.opd_coef": 0.01,
        "loss.opd_beta": 5.0, "loss.gate": "gap", "loss.agg": "token-mean", "loss.adv_norm": "mean_std",
        "grsd.lam": 0.5, "grsd.g_max": 0.2, "grsd.eta": 0.0, "grsd.reflection_coef": 0.01,
        "optim.lr": 1e-6, "optim.weight_decay": 0.01, "optim.grad_clip": 1.0,
        "optim.schedule": "constant", "trainer.steps": 150, "sft.epochs": 3, "sft.lr": 5e-6,
        "collect.tasks": 180, "collect.rollouts_per_task": 8,
        "skill.teacher_params": "old", "skill.skill_mode": "episode_only", "run.out_dir": "runs",
    }
    for key, expected in spec.items():
        section, _, name = key.partition(".")
        assert getattr(getattr(c, section), name) == expected, key


def test_default_config_is_valid_and_every_option_is_documented():
    assert validate(Config()) == Config()
    opts = options()
    assert len(opts) == len(set(option_keys())) > 100
    for o in opts:
        assert o.doc.strip() and "\n" not in o.doc, o.key


def test_overrides_parse_as_yaml_scalars():
    c = load("trainer.steps=7", "optim.lr=3e-4", "loss.dual_clip=null", "log.tensorboard=false",
             "optim.betas=[0.9, 0.95]", "algorithm=grpo", "env.levels=3-6", "rollout.temperature=2",
             "trainer.profile_steps=5:7", "run.name=yes", "skill.external.endpoint=http://h:8000/v1?a=b")
    assert c.trainer.steps == 7 and type(c.trainer.steps) is int
    assert c.optim.lr == 3e-4  # plain PyYAML would leave '3e-4' a string
    assert c.loss.dual_clip is None and c.log.tensorboard is False
    assert c.optim.betas == [0.9, 0.95] and c.algorithm == "grpo"
    assert c.env.levels == [3, 4, 5, 6]
    assert c.rollout.temperature == 2.0 and type(c.rollout.temperature) is float
    assert c.trainer.profile_steps == "5:7" and c.trainer.profile_range() == range(5, 8)  # not base-60
    assert c.run.name == "yes"  # YAML 1.2: not a boolean
    assert c.skill.external.endpoint == "http://h:8000/v1?a=b"  # split at the first '=' only


def test_later_override_wins_and_input_is_untouched():
    base = load("trainer.steps=3")
    c = apply_overrides(base, ["trainer.steps=4", "trainer.steps=5"])
    assert c.trainer.steps == 5 and base.trainer.steps == 3


def test_parse_overrides_nests_dotted_keys():
    assert parse_overrides(["a.b.c=1", "a.b.d=x", "e=[1, 2]"]) == {"a": {"b": {"c": 1, "d": "x"}}, "e": [1, 2]}


@pytest.mark.parametrize("bad", ["trainer.steps", "=3", "trainer..steps=3", "trainer steps=3"])
def test_malformed_override_is_named(bad):
    with pytest.raises(ConfigError, match="must look like key=value") as e:
        parse_overrides([bad])
    assert repr(bad) in str(e.value)


@pytest.mark.parametrize("key, suggestion", [
    ("trainer.stepz", "trainer.steps"),   # typo in the field
    ("trainr.steps", "trainer.steps"),    # typo in the section
    ("trainer.lr", "optim.lr"),           # right field, wrong section
    ("loss.clip_hi", "loss.clip_high"),
    ("algoritm", "algorithm"),
    ("skill.external.endpont", "skill.external.endpoint"),
])
def test_unknown_key_names_it_and_suggests_the_closest(key, suggestion):
    with pytest.raises(ConfigError) as e:
        load(f"{key}=1")
    msg = str(e.value)
    assert f"unknown config key '{key}'" in msg and f"did you mean '{suggestion}'" in msg


def test_unknown_key_without_anything_close_has_no_suggestion():
    with pytest.raises(ConfigError, match="unknown config key 'zzzqqq'") as e:
        load("zzzqqq=1")
    assert "did you mean" not in str(e.value)


@pytest.mark.parametrize("override, key, allowed", [
    ("loss.gate=gapp", "loss.gate", "gap, entropy, soft_or"),
    ("algorithm=SEED", "algorithm", "grpo, sdar, seed, grsd"),
    ("skill.insertion=late", "skill.insertion", "after_task, before_response, prepend"),
    ("loss.agg=mean", "loss.agg", "token-mean, seq-mean-token-mean, seq-mean-token-sum"),
    ("demo.algorithms=[grpo, ppo]", "demo.algorithms[1]", "grpo, sdar, seed, grsd"),
])
def test_bad_enum_names_key_and_allowed_values(override, key, allowed):
    with pytest.raises(ConfigError) as e:
        load(override)
    msg = str(e.value)
    assert msg.startswith(f"{key}:") and f"choose one of: {allowed}" in msg


def test_bad_enum_suggests_the_close_value():
    with pytest.raises(ConfigError, match="did you mean 'seed'"):
        load("algorithm=SEED")


@pytest.mark.parametrize("override, message", [
    ("trainer.steps=abc", "trainer.steps: expected int, got 'abc' (str)"),
    ("trainer.steps=1.5", "trainer.steps: expected int, got 1.5 (float)"),
    ("trainer.steps=true", "trainer.steps: expected int, got true (bool)"),
    ("trainer.steps=null", "trainer.steps: expected int, got null (NoneType)"),
    ("optim.lr=fast", "optim.lr: expected float, got 'fast' (str)"),
    ("log.progress=maybe", "log.progress: expected bool, got 'maybe' (str)"),
    ("log.progress=yes", "log.progress: expected bool, got 'yes' (str) (write true or false)"),
    ("optim.betas=0.9", "optim.betas: expected list of float, got 0.9 (float)"),
    ("optim.betas=[0.9, x]", "optim.betas[1]: expected float, got 'x' (str)"),
    ("loss.dual_clip=big", "loss.dual_clip: expected float or null, got 'big' (str)"),
    ("run.name=[a]", "run.name: expected str, got ['a'] (list)"),
    ("rollout.vllm_enforce_eager=1", "rollout.vllm_enforce_eager: expected bool, got 1 (int)"),
    ("rollout.vllm_max_num_seqs=8.5", "rollout.vllm_max_num_seqs: expected int or null, got 8.5 (float)"),
])
def test_bad_type_names_key_value_and_expected_type(override, message):
    with pytest.raises(ConfigError) as e:
        load(override)
    assert str(e.value).startswith(message), str(e.value)
    assert f"from override {override!r}" in str(e.value)


def test_section_and_leaf_shapes_are_checked():
    with pytest.raises(ConfigError, match="model is a section, not a value"):
        load("model=3")
    with pytest.raises(ConfigError, match="trainer.steps: expected int, got {'a': 1}"):
        load("trainer.steps={a: 1}")


@pytest.mark.parametrize("override, message", [
    ("loss.clip_low=1.5", r"loss.clip_low: must be in \(0, 1\), got 1.5"),
    ("loss.clip_high=0", r"loss.clip_high: must be in \(0, 1\), got 0.0"),
    ("loss.dual_clip=0.5", r"loss.dual_clip: must be in \(1, inf\), got 0.5"),
    ("rollout.top_p=1.5", r"rollout.top_p: must be in \(0, 1\], got 1.5"),
    ("trainer.steps=0", r"trainer.steps: must be in \[1, inf\), got 0"),
    ("optim.lr=-1e-5", r"optim.lr: must be in \(0, inf\), got -1e-05"),
    ("rollout.vllm_max_num_seqs=0", r"rollout.vllm_max_num_seqs: must be in \[1, inf\), got 0"),
    ("rollout.vllm_max_model_len=0", r"rollout.vllm_max_model_len: must be in \[1, inf\), got 0"),
])
def test_out_of_range_values_are_named(override, message):
    with pytest.raises(ConfigError, match=message):
        load(override)


@pytest.mark.parametrize("overrides, message", [
    (["algorithm=sdar"], "algorithm=sdar needs a static skill provider: set skill.library"),
    (["skill.analyzer=external"], "skill.external.endpoint is required"),
    (["skill.analyzer=external", "skill.external.endpoint=http://x/v1"], "skill.external.model is required"),
    (["algorithm=grsd"], "skill.external.endpoint is required: algorithm=grsd"),
    (["model.tiny.kv_heads=3"], "model.tiny.kv_heads=3 must divide model.tiny.heads=4"),
    (["model.tiny.hidden=130"], "model.tiny.hidden=130 must be a multiple of model.tiny.heads=4"),
    (["rollout.engine=vllm"], "rollout.engine=vllm needs an HF model folder in model.path"),
    (["env.game_type=pick_two_obj"], "env.game_type: 'pick_two_obj' is not a textworld game type"),
    (["env.kind=alfworld", "env.game_type=pick_two_obj"], "env.game_type: 'pick_two_obj' is not a alfworld game "
                                                          "type; choose one of: all, pick_and_place_simple,"),
    (["env.levels=[0, 1]"], "env.levels: expected levels >= 1"),
    (["trainer.profile_steps=7:5"], "trainer.profile_steps: expected A:B"),
    (["trainer.micro_batch_tokens=1024"], "trainer.micro_batch_tokens=1024 is below the longest sample"),
    (["optim.betas=[0.9]"], "optim.betas: expected two numbers"),
    (["demo.algorithms=[seed, seed]"], "demo.algorithms: expected distinct"),
    (["rollout.vllm_max_model_len=2559"], "rollout.vllm_max_model_len=2559 is below the longest rollout sequence"),
])
def test_cross_field_rules(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load(*overrides)


def test_cross_field_rules_accept_the_fixed_settings():
    assert load("algorithm=sdar", "skill.library=skills.json").skill.library == "skills.json"
    assert load("algorithm=sdar", "skill.analyzer=oracle").algorithm == "sdar"
    assert load("algorithm=grsd", "grsd.judge=oracle").algorithm == "grsd"
    assert load("rollout.vllm_max_model_len=2560").rollout.vllm_max_model_len == 2560
    c = load("env.kind=alfworld", "env.game_type=pick_two_obj_and_place", "env.n_train=null")
    assert c.env.n_train is None and c.env.game_type == "pick_two_obj_and_place"


def test_collect_needs_the_endpoint_only_for_that_command():
    load_config(None, [])  # collect_analyzer=external without endpoint is fine for other commands
    with pytest.raises(ConfigError, match="skill.external.endpoint is required: seedfast collect"):
        load_config(None, [], command="collect")
    load_config(None, ["skill.collect_analyzer=oracle"], command="collect")


def test_suspicious_settings_warn():
    with pytest.warns(ConfigWarning, match="rollout.n=1"):
        load("rollout.n=1")
    with pytest.warns(ConfigWarning, match="opd_coef=0 trains plain GRPO"):
        load("loss.opd_coef=0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load("rollout.n=2")


def test_validate_catches_values_set_in_code():
    c = Config()
    c.trainer.steps = "many"
    with pytest.raises(ConfigError, match="trainer.steps: expected int"):
        validate(c)
    c = Config()
    c.optim.lr = 1  # normalized to float
    assert type(validate(c).optim.lr) is float
    with pytest.raises(TypeError, match="cfg must be a seedfast Config"):
        validate({"trainer": {}})


def test_yaml_round_trip(tmp_path):
    c = load("run.name=rt", f"run.out_dir={tmp_path}", "algorithm=grsd", "grsd.judge=oracle", "optim.lr=3e-7",
             "loss.dual_clip=null", "env.levels=2-4", "optim.betas=[0.8, 0.95]", "run.name=on",
             "trainer.profile_steps=5:7", "model.tiny.rope_theta=1000000", "skill.library=1:2",
             "demo.algorithms=[seed]", "sft.max_seconds=12.5")
    assert parse_yaml(c.to_yaml()) == c.to_dict()
    assert config_from_dict(parse_yaml(c.to_yaml())) == c
    path = c.save()
    assert path == tmp_path / "on" / "config.yaml"
    assert load_config(path) == c
    assert load_config(path.parent) == c  # a run folder stands for its config.yaml


def test_every_option_survives_the_round_trip():
    data = Config().to_dict()
    for key in option_keys():
        node = data
        for part in key.split(".")[:-1]:
            node = node[part]
        assert key.split(".")[-1] in node, key
    assert config_from_dict(parse_yaml(Config().to_yaml())) == Config()


def test_yaml_file_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  steps: [1\n")
    with pytest.raises(ConfigError, match=f"{bad}: not valid YAML"):
        load_config(bad)
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="config: expected a mapping"):
        load_config(bad)
    bad.write_text("trainer:\n  stepz: 3\n  eval_every: 2\n")
    with pytest.raises(ConfigError, match=rf"unknown config key 'trainer.stepz' \(did you mean 'trainer.steps'\?\) "
                                          rf"\(in {bad}\)"):
        load_config(bad)
    bad.write_text("trainr:\n  steps: 3\n  eval_every: 2\n")
    with pytest.raises(ConfigError, match="unknown config key 'trainr' \\(did you mean 'trainer'"):
        load_config(bad)


def test_empty_sections_and_files_keep_defaults(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("")
    assert load_config(f) == Config()
    f.write_text("loss:\ntrainer:\n  steps: 9\n")
    c = load_config(f, ["trainer.eval_every=3"])
    assert (c.trainer.steps, c.trainer.eval_every, c.loss) == (9, 3, Config().loss)


def test_help_lists_every_option_with_a_default_that_parses_back():
    text = options_help()
    seen = {}
    for line in text.splitlines():
        if " = " in line:
            key, _, rest = line.strip().partition(" = ")
            seen[key] = rest.split("  ")[0]
    defaults = {o.key: o.default for o in options()}
    assert set(seen) == set(defaults)
    for key, shown in seen.items():
        assert parse_yaml(shown) == defaults[key], key
    assert "[gap|entropy|soft_or]" in text


def test_shipped_configs_load():
    demo = load_config(CONFIGS / "demo_cpu.yaml")
    assert (demo.model.path, demo.model.tiny.hidden, demo.model.tiny.layers) == (None, 128, 2)
    assert (demo.env.kind, demo.env.game_type) == ("textworld", "treasure_hunter")
    assert demo.rollout.n == 8 and demo.rollout.tasks_per_batch >= 2 and 8 <= demo.trainer.steps <= 16
    # RL on a small pool memorizes it and costs held-out success; fresh draws measure transfer (docs/demo.md)
    pool, draws = demo.rollout.task_pool, demo.trainer.steps * demo.rollout.tasks_per_batch
    assert pool is not None and pool >= 40 and draws >= 1.5 * pool, (pool, draws)
    assert demo.sft.behaviour_cloning and demo.sft.prompt_loss and demo.sft.skill_augment
    assert demo.sft.copy_warmup_steps > 0 and demo.sft.renamed_copies > 0 and demo.sft.rename_names == "textworld"
    assert set(demo.demo.algorithms) == {"seed", "grpo"}
    for name in ("qwen2.5-7b_alfworld_8xh100.yaml", "qwen2.5-3b_alfworld.yaml"):
        c = load_config(CONFIGS / name, command="collect")
        assert c.env.kind == "alfworld" and c.algorithm == "seed"
        paper = {"rollout.n": 8, "rollout.tasks_per_batch": 16, "trainer.steps": 150, "optim.lr": 1e-6,
                 "optim.weight_decay": 0.01, "optim.grad_clip": 1.0, "optim.schedule": "constant",
                 "rollout.max_prompt_length": 2048, "rollout.max_response_tokens": 512,
                 "rollout.temperature": 1.0, "rollout.eval_temperature": 0.4, "sft.epochs": 3, "sft.lr": 5e-6,
                 "collect.tasks": 180, "collect.rollouts_per_task": 8, "env.history_k": 5}
        for key, expected in paper.items():
            section, _, field = key.partition(".")
            assert getattr(getattr(c, section), field) == expected, (name, key)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_base_merges_sections_and_replaces_lists(tmp_path):
    assert merge_configs({"a": {"x": [1, 2], "y": 1}, "b": 2}, {"a": {"x": [3]}, "c": None}) == \
        {"a": {"x": [3], "y": 1}, "b": 2, "c": None}
    assert merge_configs({"a": {"y": 1}}, {"a": None}) == {"a": {"y": 1}}  # an empty section sets nothing
    _write(tmp_path / "base.yaml", "trainer:\n  steps: 7\n  eval_every: 2\nenv:\n  levels: [1, 2, 3]\n"
                                   "optim:\n  betas: [0.8, 0.9]\n")
    child = _write(tmp_path / "child.yaml", "base: base.yaml\ntrainer:\n  steps: 9\nenv:\n  levels: [4]\noptim:\n")
    c = load_config(child)
    assert (c.trainer.steps, c.trainer.eval_every) == (9, 2)  # the including file wins, key by key
    assert c.env.levels == [4]  # a list replaces the base's, it is not merged
    assert c.optim.betas == [0.8, 0.9]
    assert load_config(child, ["trainer.steps=11"]).trainer.steps == 11  # overrides win over both
    assert "base" not in c.to_dict()


def test_base_chains_relative_to_each_file(tmp_path):
    _write(tmp_path / "c.yaml", "trainer:\n  steps: 3\n  eval_every: 3\n  checkpoint_every: 3\n")
    _write(tmp_path / "sub" / "b.yaml", "base: ../c.yaml\ntrainer:\n  eval_every: 2\n  checkpoint_every: 2\n")
    a = _write(tmp_path / "a.yaml", "base: sub/b.yaml\ntrainer:\n  checkpoint_every: 1\n")
    data, files = read_config_file(a)
    assert files == [a, tmp_path / "sub" / "b.yaml", tmp_path / "sub" / "../c.yaml"]
    t = load_config(a).trainer
    assert (t.steps, t.eval_every, t.checkpoint_every) == (3, 2, 1)
    # a bad key in a base names the files it came through
    _write(tmp_path / "c.yaml", "trainer:\n  stepz: 3\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'trainer.stepz'.*\(in .*a.yaml, based on .*b.yaml, "
                                          r".*c.yaml\)"):
        load_config(a)


def test_base_cycles_and_missing_bases_are_refused(tmp_path):
    a = _write(tmp_path / "a.yaml", "base: b.yaml\n")
    _write(tmp_path / "b.yaml", "base: ./a.yaml\n")
    with pytest.raises(ConfigError, match=r"config files include each other in a cycle: .*a.yaml -> .*b.yaml -> "
                                          r".*a.yaml"):
        load_config(a)
    _write(tmp_path / "self.yaml", "base: self.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "self.yaml")
    _write(tmp_path / "b.yaml", "base: nope.yaml\n")
    with pytest.raises(ConfigError, match=rf"config file not found: {tmp_path / 'nope.yaml'} \(the base of "
                                          rf"{tmp_path / 'b.yaml'}\)"):
        load_config(a)
    _write(tmp_path / "b.yaml", "base: 3\n")
    with pytest.raises(ConfigError, match="base: expected the path of a config file"):
        load_config(a)
    _write(tmp_path / "b.yaml", "base: list.yaml\n")
    _write(tmp_path / "list.yaml", "- 1\n")
    with pytest.raises(ConfigError, match="config: expected a mapping of keys, got .* the base of"):
        load_config(a)


def _leaf_keys(data, prefix=""):
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _leaf_keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


QWEN_RECIPES = sorted(CONFIGS.glob("qwen2.5-*.yaml"))


@pytest.mark.parametrize("recipe", QWEN_RECIPES, ids=lambda p: p.name)
def test_each_qwen_recipe_sets_only_what_differs_from_its_base(recipe):
    own = parse_yaml(recipe.read_text())
    assert isinstance(own.get("base"), str), f"{recipe.name} does not start from a base"
    base = recipe.parent / own.pop("base")
    set_here = dict(_leaf_keys(own))
    assert {"run.name", "model.path"} <= set(set_here) and len(set_here) <= 5, set_here
    from_base = load_config(base, ["model.path=models/placeholder"]).to_dict()
    loaded = load_config(recipe).to_dict()
    base_values, recipe_values = dict(_leaf_keys(from_base)), dict(_leaf_keys(loaded))
    differs = {k for k in recipe_values if recipe_values[k] != base_values[k]}
    assert differs == set(set_here), (recipe.name, differs, set(set_here))  # nothing redundant, nothing implied
    on_base = load_config(base, [f"{k}={format_value(v)}" for k, v in set_here.items()])
    assert on_base == load_config(recipe)


def test_schema_is_plain_dataclasses():
    # Other modules take sections by type (e.g. a LossConfig); keep them real dataclasses.
    assert all(dataclasses.is_dataclass(getattr(Config(), f.name)) or f.name == "algorithm"
               for f in dataclasses.fields(Config))


@pytest.mark.parametrize("command", ["eval", "demo", "sft"])
def test_vllm_is_refused_where_nothing_would_use_it(command):
    with pytest.raises(ConfigError, match=f"rollout.engine=vllm: `seedfast {command}` samples with the own engine"):
        load_config(None, ["model.path=/m", "rollout.engine=vllm"], command=command)
    collect = load_config(None, ["model.path=/m", "rollout.engine=vllm", "skill.collect_analyzer=oracle"],
                          command="collect")
    assert collect.rollout.engine == "vllm"
    train = load_config(None, ["model.path=/m", "rollout.engine=vllm"], command="train")
    assert train.rollout.engine == "vllm" and train.rollout.sync_bucket_mb == 512


def test_master_weights_are_fp32_unless_asked_and_then_a_warning():
    cfg = load_config(None, ["model.dtype=bf16"])
    assert (cfg.optim.master_dtype, cfg.dist.reduce_dtype) == ("fp32", "fp32")
    with pytest.warns(ConfigWarning, match="optim.master_dtype=bf16: .* rounds away"):
        load_config(None, ["model.dtype=bf16", "optim.master_dtype=bf16"])
    for compute, master in (("fp32", "bf16"), ("bf16", "fp16"), ("fp16", "bf16")):
        with pytest.raises(ConfigError, match=f"optim.master_dtype={master} with model.dtype={compute}"):
            load_config(None, [f"model.dtype={compute}", f"optim.master_dtype={master}"])


def test_lora_keys_are_checked_with_the_key_named(tmp_path):
    cfg = load_config(None, ["model.lora.rank=8", "model.lora.targets=[q_proj, down_proj]"])
    assert (cfg.model.lora.rank, cfg.model.lora.targets) == (8, ["q_proj", "down_proj"])
    with pytest.raises(ConfigError, match=r"model.lora.targets: expected distinct names among .* got \[lm_head\]"):
        load_config(None, ["model.lora.rank=8", "model.lora.targets=[lm_head]"])
    with pytest.raises(ConfigError, match="model.lora.targets: expected distinct names"):
        load_config(None, ["model.lora.rank=8", "model.lora.targets=[q_proj, q_proj]"])
    with pytest.raises(ConfigError, match="model.lora.rank: must be"):
        load_config(None, ["model.lora.rank=-1"])
    with pytest.raises(ConfigError, match="model.lora.adapter=.* is not a PEFT adapter folder"):
        load_config(None, [f"model.lora.adapter={tmp_path}"])
