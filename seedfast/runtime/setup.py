"""The builders of a run, one of each, read from its config: device, dtype, policy folder, policy, tokenizer,
generation engine, tasks, environment slots, optimizer and learning-rate schedule, agent-loop settings.

Every command (seedfast/app/) and the trainer (train/rl.py) build their pieces here, so `collect`, `sft`,
`train`, `eval` and `demo` agree on each rule. The libraries below (rollout/, envs/, skills/) take what is
built here as explicit arguments and never read the config. See docs/architecture.md.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from seedfast.config import Config, ConfigError
from seedfast.envs.slots import LocalEnvSlots, PoolEnvSlots
from seedfast.model import is_hf_folder, load_hf
from seedfast.model.tokenizer import is_tokenizer_folder, load_tokenizer
from seedfast.rollout.agent_loop import AgentLoopConfig, Task
from seedfast.rollout.prompts import PromptStyle
from seedfast.runtime.adapters import attach_adapters, uses_lora
from seedfast.runtime.optim import adamw, lr_at
from seedfast.runtime.paths import RunPaths
from seedfast.runtime.precision import DTYPES, MasterWeights, RoundingMonitor, precision_of

if TYPE_CHECKING:  # imported where a run is sharded: a one-process run never loads torch.distributed's pieces
    from seedfast.distributed.data import DataParallel

# the commands that run over torchrun's processes with dist.strategy=fsdp (docs/scaling.md)
SHARDED_COMMANDS = ("train", "sft", "eval")


def require_one_process(command: str) -> None:
    """A code path without a process group under torchrun with several processes would train N unsynchronized
    copies: refuse it."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError(f"seedfast {command}: this path runs in one process, but WORLD_SIZE="
                          f"{os.environ['WORLD_SIZE']}; shard it with dist.strategy=fsdp (docs/scaling.md)")


def start_processes(cfg: Config, command: str) -> Any:
    """The `dist:` section against torchrun's environment: one process (dist.strategy=none; several processes are
    refused, as they would train unsynchronized copies), or the process group of a sharded run (dist.strategy=fsdp:
    nccl on CUDA, gloo on CPU). Returns this process's DistEnv (rank, world, local rank); docs/scaling.md."""
    from seedfast.distributed.mesh import DistEnv, init_process_group, mesh_shape

    env = DistEnv.from_environ()
    if cfg.dist.strategy == "none" and env.world > 1:
        raise ConfigError(f"seedfast {command} runs in one process with dist.strategy=none, but WORLD_SIZE="
                          f"{env.world}: set dist.strategy=fsdp to shard it over the torchrun processes")
    mesh_shape(cfg.dist, env.world)  # a ConfigError naming dist.* when the ranks do not fit
    if cfg.dist.strategy == "none":
        return env
    if command not in SHARDED_COMMANDS:
        raise ConfigError(f"dist.strategy=fsdp: `seedfast {command}` runs in one process; set dist.strategy=none")
    return init_process_group(device_of(cfg), env)


def policy_sharding(cfg: Config, device: torch.device, command: str
                    ) -> tuple[DataParallel, Callable[[torch.nn.Module], torch.nn.Module]] | None:
    """Under dist.strategy=fsdp, the started process group's mesh for `command` ('train' or 'sft') as (the
    data-parallel ranks of a step, distributed/data.py DataParallel; the function that shards a policy over the mesh:
    distributed/parallelize.py, activation checkpointing per dist.activation_checkpointing, FSDP2's mixed precision
    per fsdp_precision); None for a one-process run. The one place a policy is sharded: SFT gets the function
    before its model exists (app/sft.py), RL shards at once (shard_policy)."""
    if cfg.dist.strategy == "none":
        return None
    import torch.distributed as dist

    from seedfast.distributed.data import DataParallel
    from seedfast.distributed.mesh import build_mesh, mesh_shape
    from seedfast.distributed.parallelize import parallelize_decoder

    if not dist.is_initialized():
        raise ConfigError("dist.strategy=fsdp: no process group is started (run under torchrun; "
                          "runtime/setup.py start_processes)")
    shape = mesh_shape(cfg.dist, dist.get_world_size())
    if command == "sft" and shape.tp > 1:
        raise ConfigError(f"dist.tp={shape.tp}: `seedfast sft` shards with FSDP2 only (its loss has no "
                          "vocabulary-parallel LM head); set dist.tp=1")
    if command == "train" and cfg.rollout.tasks_per_batch < shape.dp_shard:
        raise ConfigError(f"rollout.tasks_per_batch={cfg.rollout.tasks_per_batch} is smaller than the "
                          f"{shape.dp_shard} data-parallel ranks: every rank rolls out whole tasks")
    mesh = build_mesh(shape, device)

    def shard(model: torch.nn.Module) -> torch.nn.Module:
        return parallelize_decoder(model, mesh, activation_checkpointing=cfg.dist.activation_checkpointing,
                                   **fsdp_precision(cfg))

    return DataParallel.from_mesh(mesh), shard


def shard_policy(cfg: Config, model: torch.nn.Module, device: torch.device) -> DataParallel | None:
    """Under dist.strategy=fsdp, shard the RL policy over the started process group's mesh (`policy_sharding`) and
    return the data-parallel ranks of the step; None for a one-process run."""
    sharding = policy_sharding(cfg, device, "train")
    if sharding is None:
        return None
    dp, shard = sharding
    shard(model)
    return dp


def fsdp_precision(cfg: Config) -> dict[str, torch.dtype | None]:
    """FSDP2's mixed precision over master weights in optim.master_dtype: gathered in model.dtype, gradients
    reduced in dist.reduce_dtype (runtime/precision.py). With LoRA the same policy: the frozen base is in model.dtype
    already, the fp32 adapters are gathered in it (distributed/parallelize.py, 'LoRA')."""
    p = precision_of(cfg)
    return {"param_dtype": p.compute if p.mixed else None, "reduce_dtype": p.reduce}


def device_of(cfg: Config) -> torch.device:
    """trainer.device; under a sharded run on CUDA, this rank's GPU (LOCAL_RANK)."""
    if cfg.trainer.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but no CUDA device is available")
    kind = cfg.trainer.device if cfg.trainer.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda" and cfg.dist.strategy == "fsdp":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device(kind)


def hf_folder_key(key: str, value: str | Path) -> Path:
    """The folder the config key `key` names, which must be an HF model folder: a ConfigError naming the key
    otherwise, rather than a policy silently read from somewhere else."""
    if not is_hf_folder(value):
        raise ConfigError(f"{key}={str(value)!r} is not an HF model folder (no config.json)")
    return Path(value)


def policy_path(cfg: Config) -> Path:
    """The policy a command starts from (collect rolls it out, train trains it), in one order:

    1. trainer.init_from: an explicit choice; it must be an HF model folder (an error names it otherwise,
       rather than silently falling through to another policy);
    2. <run_dir>/sft: this run's own SFT output, when it exists (the SEED pipeline: collect -> sft -> train);
    3. model.path: the base model; it must be an HF model folder when set.

    This is the order trainer.init_from's documentation states. A fresh run has no sft/ yet, so `collect`
    (the first stage) rolls out model.path; `train` after `sft` starts from the SFT output.
    """
    if cfg.trainer.init_from:
        return hf_folder_key("trainer.init_from", cfg.trainer.init_from)
    sft = RunPaths.of(cfg).sft
    if is_hf_folder(sft):
        return sft
    base = base_policy_path(cfg)
    if base is not None:
        return base
    raise ConfigError(
        f"no policy to start from: trainer.init_from and model.path are unset and {sft} holds no config.json "
        "(set model.path to an HF model folder, or run `seedfast sft` first)"
    )


def base_policy_path(cfg: Config) -> Path | None:
    """The last step of `policy_path`'s order, the base model: model.path (it must be an HF model folder), or None
    when it is unset. `seedfast sft`, which writes <run_dir>/sft, starts here; with None it builds the tiny decoder
    of model.tiny."""
    return hf_folder_key("model.path", cfg.model.path) if cfg.model.path else None


def trained_policy_path(cfg: Config) -> Path:
    """The policy a command that only plays (`seedfast eval`) reads: the run's trained export <run_dir>/hf when it
    exists, else the policy the run would start from (`policy_path`: init_from, this run's sft/, model.path)."""
    hf = RunPaths.of(cfg).hf
    return hf if is_hf_folder(hf) else policy_path(cfg)


def load_policy(cfg: Config, path: Path, device: torch.device, trainable: bool = True,
                dtype: torch.dtype | None = None) -> torch.nn.Module:
    """The HF model at `path` in `dtype` (default model.dtype, the compute dtype) on `device`, with
    model.attn_backend (the one place that sets it on a loaded policy); frozen and in eval mode unless
    `trainable`. A policy to train comes from `trainable_policy`."""
    model = load_hf(path, dtype=dtype or DTYPES[cfg.model.dtype], device=device)
    model.attn_backend = cfg.model.attn_backend
    model.train(trainable)
    for p in model.parameters():
        p.requires_grad_(trainable)
    return model


def trainable_policy(cfg: Config, master: torch.nn.Module) -> tuple[torch.nn.Module, MasterWeights | None]:
    """(the module that computes, its MasterWeights or None) for a policy `master` in optim.master_dtype: a
    one-process run whose model.dtype is lower computes in a copy and steps the masters; otherwise (same dtype, or
    dist.strategy=fsdp, where FSDP2 casts) `master` computes itself (runtime/precision.py)."""
    p = precision_of(cfg)
    if next(master.parameters()).dtype != p.master:
        raise ValueError(f"trainable_policy: the policy is {next(master.parameters()).dtype}, optim.master_dtype "
                         f"is {cfg.optim.master_dtype}")
    if not p.mixed or cfg.dist.strategy != "none":
        return master, None
    masters = MasterWeights(master, p.compute)
    return masters.compute, masters


def load_trainable_policy(cfg: Config, path: Path, device: torch.device
                          ) -> tuple[torch.nn.Module, torch.nn.Module, MasterWeights | None]:
    """(the module that computes, the module the optimizer steps and checkpoints hold, MasterWeights or None) of
    the HF policy at `path`: loaded in optim.master_dtype, then `trainable_policy`. With LoRA (model.lora) the base
    is loaded frozen in model.dtype and the adapters added in optim.master_dtype: one module, no master copy of the
    base (runtime/adapters.py)."""
    if uses_lora(cfg):
        policy = attach_adapters(cfg, load_policy(cfg, path, device, trainable=False), base=path)
        policy.train(True)
        return policy, policy, None
    trained = load_policy(cfg, path, device, dtype=precision_of(cfg).master)
    policy, masters = trainable_policy(cfg, trained)
    return policy, trained, masters


def tokenizer_folder(cfg: Config, policy: Path | None) -> Path:
    """Where the run's tokenizer is, in one order for every command: model.tokenizer when set; else the policy
    folder `policy` when it holds a tokenizer; else <run_dir>/tokenizer (where `seedfast sft` writes the tokenizer
    it trains for a tiny decoder, which has no policy folder yet: `policy` None)."""
    if cfg.model.tokenizer:
        return Path(cfg.model.tokenizer)
    if policy is not None and is_tokenizer_folder(policy):
        return Path(policy)
    return RunPaths.of(cfg).tokenizer


def load_run_tokenizer(cfg: Config, path: Path) -> Any:
    """The tokenizer of the policy folder `path`, from `tokenizer_folder`; a ConfigError when there is none."""
    folder = tokenizer_folder(cfg, path)
    if is_tokenizer_folder(folder):
        return load_tokenizer(folder)
    if cfg.model.tokenizer:
        raise ConfigError(f"model.tokenizer={cfg.model.tokenizer!r} is not a tokenizer folder "
                          "(no tokenizer_config.json)")
    raise ConfigError(f"model.tokenizer: no tokenizer folder found (tried {path} and {folder}); "
                      "set model.tokenizer")


def build_engine(cfg: Config, path: Path, device: torch.device) -> Any:
    """The generation engine over the policy at `path`: the own KV-cache Sampler, or vLLM
    (rollout.engine=vllm, which config validation allows for `seedfast collect` only)."""
    if cfg.rollout.engine == "vllm":
        from seedfast.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(str(path), dtype=engine_dtype(cfg), seed=cfg.run.seed, **vllm_options(cfg))
    from seedfast.rollout.own_engine import Sampler

    return Sampler(load_policy(cfg, path, device, trainable=False), seed=cfg.run.seed)


def engine_dtype(cfg: Config) -> str:
    """The dtype the rollout engine computes in: rollout.vllm_dtype for vLLM when set, else model.dtype (the update's
    forward's, runtime/precision.py)."""
    return cfg.rollout.vllm_dtype or cfg.model.dtype


def vllm_options(cfg: Config) -> dict[str, Any]:
    """The rollout.* engine options of a VLLMEngine (`seedfast collect`) and of the RL loop's build_rollout, as
    vllm.LLM's keyword arguments; an option left null is not passed (vLLM's own default)."""
    r = cfg.rollout
    options: dict[str, Any] = {"gpu_memory_utilization": r.gpu_memory_utilization,
                               "tensor_parallel_size": r.tensor_parallel, "enforce_eager": r.vllm_enforce_eager}
    if r.vllm_max_num_seqs is not None:
        options["max_num_seqs"] = r.vllm_max_num_seqs
    if r.vllm_max_model_len is not None:
        options["max_model_len"] = r.vllm_max_model_len
    return options


def rl_optimizer(cfg: Config, trained: torch.nn.Module) -> tuple[torch.optim.Optimizer, Any]:
    """The RL optimizer (AdamW over optim.*, stepping `trained`: the master weights) and its schedule, counted in
    optimizer steps (the trainer steps it after each mini-batch step): optim.warmup_steps, then optim.schedule over
    trainer.steps x trainer.ppo_epochs x trainer.mini_batches, as the factor runtime/optim.lr_at gives for lr = 1
    (the one schedule, SFT's too). Then `watch_precision`."""
    o, t = cfg.optim, cfg.trainer
    optimizer = adamw([p for p in trained.parameters() if p.requires_grad], lr=o.lr, weight_decay=o.weight_decay,
                      betas=tuple(o.betas), eps=o.eps)
    total = max(t.steps * t.ppo_epochs * t.mini_batches, 1)

    def factor(step: int) -> float:
        return lr_at(step, total, 1.0, o.warmup_steps, o.schedule, o.min_lr_ratio)

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def watch_precision(cfg: Config, optimizer: torch.optim.Optimizer, masters: MasterWeights | None
                    ) -> RoundingMonitor | None:
    """Publish each step of `optimizer` to the module that computes (with `masters`); with low-precision masters
    (optim.master_dtype bf16/fp16, asked for explicitly) return the RoundingMonitor that measures the updates that
    round away (warning at the first step), else None."""
    if masters is not None:
        masters.attach(optimizer)
    return RoundingMonitor(optimizer) if precision_of(cfg).low_precision_master else None


def alfworld_game_id(game_file: str | os.PathLike) -> str:
    """'<task folder>/<trial folder>' of an ALFWorld `game.tw-pddl`: unique per game, the id
    envs/alfworld.py's AlfWorldEnv gives the same game, and its part before '-' is the task type."""
    path = Path(game_file)
    return f"{path.parent.parent.name}/{path.parent.name}"


# seedfast's splits -> ScienceWorld's: RL, SFT and collection play train variations, the in-run evaluation (selection)
# dev ones, and only `seedfast eval --split test` the held-out test ones
SCIENCEWORLD_SPLITS = {"train": "train", "eval": "dev", "test": "test"}


SCIENCEWORLD_GOLD_FILE = "scienceworld_gold.json"


def scienceworld_tasks(cfg: Config, split: str, *, walkthroughs: bool | None = None) -> list[Task]:
    """The variations of `split` of every task of env.scienceworld.tasks (env.n_train per task for train, env.n_eval
    for eval and test), the tasks interleaved (variation i of each, then i + 1) so that a cut keeps every task.

    Train tasks carry the simulator's gold sequence as their walkthrough (SFT, the oracle analyzer), cached in
    <env.games_dir>/scienceworld_gold.json; dev and test tasks never do, so no held-out solution reaches training.
    `walkthroughs=False` leaves them out (listing splits needs no simulator)."""
    from seedfast.envs.scienceworld_env import Variation, gold_sequences, variations

    sw = cfg.env.scienceworld
    limit = cfg.env.n_train if split == "train" else cfg.env.n_eval
    per_task = [variations(name, SCIENCEWORLD_SPLITS[split])[:limit] for name in sw.tasks]
    specs = [Variation(name, chosen[i], sw.simplifications) for i in range(max(map(len, per_task), default=0))
             for name, chosen in zip(sw.tasks, per_task) if i < len(chosen)]
    if split != "train" or walkthroughs is False:
        return [Task(game_id=str(spec), spec=spec) for spec in specs]
    gold = gold_sequences(specs, Path(cfg.env.games_dir) / SCIENCEWORLD_GOLD_FILE, heap_mb=sw.heap_mb)
    return [Task(game_id=str(spec), spec=spec, walkthrough=gold[spec]) for spec in specs]


def load_tasks(cfg: Config, split: str, *, generate: bool = False, skipped: list[str] | None = None) -> list[Task]:
    """The games of `split` ('train' or 'eval'; 'test' for ScienceWorld, whose 'eval' is its dev split):
    env.n_train / env.n_eval of them (per level for TextWorld, per task for ScienceWorld).

    TextWorld games are read from the manifest of env.games_dir; with `generate`, the missing ones of this split
    are made first (make_games, cached). ALFWorld games come from its data (eval = out of distribution).
    Every TextWorld game is checked against the manifest's sizes and sha256 first: a missing or damaged one stops
    the command (GameFileError naming each file), or with env.damaged_games=skip is left out with a warning and
    its line appended to `skipped` (the caller counts them in its metrics).
    """
    if cfg.env.kind == "scienceworld":
        return scienceworld_tasks(cfg, split)
    if split not in ("train", "eval"):
        raise ConfigError(f"split {split!r}: env.kind={cfg.env.kind} has the splits 'train' and 'eval' (its held-out "
                          "games); 'test' is ScienceWorld's")
    limit = cfg.env.n_train if split == "train" else cfg.env.n_eval
    if cfg.env.kind == "alfworld":
        from seedfast.envs.alfworld import list_alfworld_games  # a clear error without alfworld and its data

        try:
            files = list_alfworld_games("train" if split == "train" else "eval_out_of_distribution",
                                        cfg.env.games_dir, task_type=cfg.env.game_type)
        except FileNotFoundError as err:
            raise ConfigError(f"env.games_dir: {err}") from err
        return [Task(game_id=alfworld_game_id(f), spec=f) for f in files[:limit]]
    if generate:
        from seedfast.envs.textworld_games import make_games

        e = cfg.env
        n_train, n_eval = (limit, 0) if split == "train" else (0, limit)
        records = make_games(e.games_dir, e.game_type, e.levels, n_train, n_eval, seed=e.games_seed,
                             workers=e.workers or os.cpu_count() or 1)
        return [Task.from_record(r) for r in records if r.split == split]
    from seedfast.envs.textworld_games import load_manifest

    try:
        records = load_manifest(cfg.env.games_dir, split=split, game_type=cfg.env.game_type,
                                levels=cfg.env.levels)
    except FileNotFoundError as err:
        raise ConfigError(f"env.games_dir: {err} (`seedfast envs make` generates games)") from err
    if not records:
        raise ConfigError(f"env.games_dir={cfg.env.games_dir!r} has no {split} games of type "
                          f"{cfg.env.game_type} at levels {cfg.env.levels}")
    if limit is not None:  # n_train / n_eval count games per level
        per_level: dict[int, int] = {}
        kept = []
        for r in records:
            if per_level.get(r.level, 0) < limit:
                per_level[r.level] = per_level.get(r.level, 0) + 1
                kept.append(r)
        records = kept
    from seedfast.envs.textworld_games import require_games

    records, damaged = require_games(records, skip=cfg.env.damaged_games == "skip")
    for line in damaged:
        warnings.warn(f"env.damaged_games=skip: {split} {line}: left out", stacklevel=2)
    if skipped is not None:
        skipped.extend(damaged)
    if not records:
        raise ConfigError(f"env.games_dir={cfg.env.games_dir!r}: every {split} game is missing or damaged")
    return [Task.from_record(r) for r in records]


def env_slot_count(cfg: Config, eval_games: int) -> int:
    """The slots of a run's one environment pool, shared by its rollouts and evaluations: env.slots, else enough
    for a whole rollout batch (tasks_per_batch x n) and for all `eval_games` at once."""
    return cfg.env.slots or max(cfg.rollout.tasks_per_batch * cfg.rollout.n, eval_games, 1)


def env_processes() -> int:
    """Environment worker processes of this process: its usable CPUs, shared with the other torchrun processes of
    the node (LOCAL_WORLD_SIZE). Rollouts alternate generation and environment steps, so the workers need not leave
    a CPU to the trainer; more workers than CPUs would only add memory."""
    from seedfast.envs.workers import usable_cpus

    return max(1, usable_cpus() // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def scienceworld_factory(cfg: Config, step_limit: int | None = None) -> Any:
    """The ScienceWorldFactory of env.scienceworld.* and env.max_steps (the slots'), or of `step_limit` steps
    (SFT's replays: a gold sequence longer than an RL episode is still a solution to learn from)."""
    from seedfast.envs.scienceworld_env import ScienceWorldFactory

    sw = cfg.env.scienceworld
    return ScienceWorldFactory(step_limit=step_limit or cfg.env.max_steps, heap_mb=sw.heap_mb,
                               call_timeout_s=sw.call_timeout_s, max_chars=sw.max_text_chars)


def prompt_style(cfg: Config) -> PromptStyle:
    """The agent's prompt style for env.kind: ScienceWorld's names its action templates instead of listing the
    admissible actions, which run to a thousand a step (docs/environments.md, 'ScienceWorld')."""
    if cfg.env.kind == "scienceworld":
        from seedfast.envs.scienceworld_env import INSTRUCTIONS, SYSTEM_PROMPT

        return PromptStyle(system=SYSTEM_PROMPT, instructions=INSTRUCTIONS, history_k=cfg.env.history_k,
                           show_admissible=False)
    return PromptStyle(history_k=cfg.env.history_k)


def make_env_slots(cfg: Config, n_slots: int) -> Any:
    """`n_slots` environments of env.kind: in this process (env.isolation=inline), or hosted by `env_processes()`
    worker processes (an idle slot costs no process; build one pool per run and reuse it)."""
    factory: Any
    if cfg.env.kind == "alfworld":
        from seedfast.envs.alfworld import AlfWorldEnv as factory
    elif cfg.env.kind == "scienceworld":
        from seedfast.envs.scienceworld_env import slot_cap

        sw = cfg.env.scienceworld
        factory = scienceworld_factory(cfg)
        cap = slot_cap(sw.heap_mb)
        if n_slots > cap:  # one JVM per slot: more than the memory holds would swap or be OOM-killed
            warnings.warn(f"env.kind=scienceworld: {n_slots} slots need {n_slots} simulator JVMs; this machine's "
                          f"memory holds {cap} at env.scienceworld.heap_mb={sw.heap_mb} (docs/environments.md, "
                          "'ScienceWorld'): the episodes run in waves of that many", stacklevel=2)
            n_slots = cap
    else:
        from seedfast.envs.textworld_env import TextWorldEnv as factory
    if cfg.env.step_delay_s > 0:  # a slower environment than the game (envs/delayed.py)
        from seedfast.envs.delayed import DelayedFactory

        factory = DelayedFactory(factory, cfg.env.step_delay_s)
    if cfg.env.isolation == "inline":
        return LocalEnvSlots(factory, n_slots)
    from seedfast.envs.workers import EnvPool

    return PoolEnvSlots(EnvPool(n_slots, env_factory=factory, processes=env_processes(),
                                step_timeout=cfg.env.step_timeout_s))


def agent_config(cfg: Config, *, n: int, temperature: float) -> AgentLoopConfig:
    return AgentLoopConfig(n=n, max_steps=cfg.env.max_steps, max_new_tokens=cfg.rollout.max_response_tokens,
                           temperature=temperature, top_p=cfg.rollout.top_p,
                           invalid_penalty=cfg.env.invalid_penalty,
                           max_prompt_tokens=cfg.rollout.max_prompt_length,
                           style=prompt_style(cfg), world=cfg.env.kind)
