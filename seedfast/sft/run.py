"""`seedfast sft CONFIG`: stage-1 supervised fine-tuning (skill writing, + behaviour cloning for tiny models).

    main(cfg)  ->  <run_dir>/sft/ (config.json, safetensors, tokenizer)  +  <run_dir>/sft_metrics.jsonl
                   (+ TensorBoard in <run_dir>/tb/sft and W&B, as log.* asks)

Data (sft/examples.py): skill-writing pairs from sft.data (default: this run's collect output, when it exists);
with sft.behaviour_cloning, every walkthrough step of the training games as the agent loop prompts it
(+ with sft.skill_augment, copies in the RL teacher's context holding the oracle analyzer's skills) and, when
there is no pairs file, oracle skill-writing pairs on those walkthroughs and a few failed variants. The policy is
model.path, or a from-scratch tiny decoder (sft/tiny_model.py) whose BPE tokenizer is trained on the same game text
(sft/tokenizer.py); the output folder is written whole (sft/folder.py).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seedfast.config import Config, ConfigError
from seedfast.rollout.collect import PAIRS_FILE
from seedfast.rollout.prompts import PromptStyle
from seedfast.runtime.metrics import MetricsLogger, NullLogger
from seedfast.runtime.paths import RunPaths, collect_dir
from seedfast.runtime.progress import shows_progress
from seedfast.runtime.setup import base_policy_path
from seedfast.sft import examples as sft_data
from seedfast.sft.copy_warmup import copy_warmup
from seedfast.sft.folder import save_policy
from seedfast.sft.loop import SFTStats, Sharding, evaluate_loss, train_sft  # noqa: F401 (re-exported)
from seedfast.sft.rename import renamed_copies, textworld_object_names
from seedfast.sft.replay import GameReplays, replay_games
from seedfast.sft.tiny_model import initial_model
from seedfast.sft.tokenizer import initial_tokenizer, ordinary_ids, tokenizer_corpus
from seedfast.skills.analyzers import OracleAnalyzer
from seedfast.skills.result import SkillResult

__all__ = ["SFTStart", "Sharding", "evaluate_loss", "main", "metrics_logger", "pairs_path", "prompt_style",
           "reader_skills", "sft_examples", "sft_start", "train_sft", "walkthrough_replays"]

NO_DATA = ("no SFT data: set sft.data to a JSONL of (messages -> answer) pairs, run `seedfast collect` "
           "first, or set sft.behaviour_cloning=true")


# ------------------------------------------------------------------------------------------------ data


def pairs_path(cfg: Config) -> Path | None:
    """sft.data (it must exist), else this run's collect output if it exists, else None."""
    if cfg.sft.data:
        path = Path(cfg.sft.data)
        if not path.is_file():
            raise ConfigError(f"sft.data={cfg.sft.data!r} is not a file")
        return path
    collected = collect_dir(cfg) / PAIRS_FILE
    return collected if collected.is_file() else None


def walkthrough_replays(cfg: Config) -> list[GameReplays]:
    """The RL run's training games (runtime/setup.load_tasks), each walkthrough played, with failed variants,
    plus sft.renamed_copies renamed copies of each walkthrough (sft/rename.py)."""
    from seedfast.runtime.setup import load_tasks, scienceworld_factory

    if cfg.env.kind == "alfworld":
        raise ConfigError(f"sft.behaviour_cloning needs walkthroughs (TextWorld's, ScienceWorld's gold sequences); "
                          f"env.kind={cfg.env.kind!r} has none")
    tasks = load_tasks(cfg, "train")
    make_env = None
    if cfg.env.kind == "scienceworld":
        # its train tasks carry their gold sequences, played whole even where one is longer than env.max_steps; its
        # environments are closed after each game, their JVM kept for the next (envs/scienceworld_env.py)
        make_env = scienceworld_factory(cfg, step_limit=max(len(t.walkthrough or ()) for t in tasks) + 1)
    replays = replay_games(tasks, seed=cfg.run.seed, make_env=make_env)
    for game in replays:  # the analyzer's prompt follows the world (skills/prompts.py ANALYZER_WORLDS)
        for trajectory in (game.success, *game.failures):
            trajectory.meta["world"] = cfg.env.kind
    if cfg.sft.renamed_copies:
        pool = textworld_object_names() if cfg.sft.rename_names == "textworld" else None
        renamed = renamed_copies([g.success for g in replays], cfg.sft.renamed_copies, seed=cfg.run.seed,
                                 pool=pool)
        replays += [GameReplays(t.game_id, t) for t in renamed]
    return replays


def prompt_style(cfg: Config) -> PromptStyle:
    """The agent loop's prompt style for this config (as collect and the RL loop build it)."""
    from seedfast.runtime.setup import prompt_style as style_of

    return style_of(cfg)


def sft_examples(cfg: Config, tokenizer: Any, replays: Sequence[GameReplays],
                 pairs_file: Path | None) -> tuple[list[sft_data.SFTExample], dict[str, Any]]:
    """All examples the config asks for, and counts for the log."""
    examples: list[sft_data.SFTExample] = []
    skipped: Counter = Counter()
    limit, sft = cfg.rollout.max_prompt_length, cfg.sft
    if pairs_file is not None:
        examples += sft_data.jsonl_examples(tokenizer, pairs_file, max_prompt_tokens=limit)
    if sft.behaviour_cloning:
        examples += sft_data.bc_examples(
            tokenizer, [g.success for g in replays], style=prompt_style(cfg), max_prompt_tokens=limit,
            prompt_loss=sft.prompt_loss, skill_insertion=cfg.skill.insertion if sft.skill_augment else None,
            skill_fraction=sft.skill_augment_fraction, max_skill_tokens=cfg.skill.max_skill_tokens,
            seed=cfg.run.seed, skills=reader_skills(replays, cfg.skill.skill_mode) if sft.skill_augment else None,
            skill_mode=cfg.skill.skill_mode, teacher_mode=cfg.skill.teacher_mode)
        if pairs_file is None:
            # sft.skill_writing_fraction: the share of games whose replays are also turned into skill-writing
            # pairs; their prompts are long, so this is a compute knob
            share = sft.skill_writing_fraction
            chosen = random.Random(cfg.run.seed).sample(range(len(replays)), round(share * len(replays)))
            trajectories = [t for i in sorted(chosen) for t in (replays[i].success, *replays[i].failures)]
            written, skipped = sft_data.skill_writing_examples(
                tokenizer, trajectories, skill_mode=cfg.skill.skill_mode, max_prompt_tokens=limit)
            examples += written
    if not examples:
        raise ConfigError(NO_DATA)
    counts = {**sft_data.summarize(examples), **{f"skipped/{k}": v for k, v in skipped.items()}}
    return examples, {**counts, "pairs_file": str(pairs_file) if pairs_file else None}


def reader_skills(replays: Sequence[GameReplays], skill_mode: str = "episode_only") -> list[list[SkillResult]]:
    """Per game, the skills its walkthrough's skill-augmented steps read: what the oracle analyzer (and the self
    analyzer SFT'd on its answers) writes for the walkthrough and for each failed replay of that game, so the
    policy learns to read a winner's workflow and a loser's avoidance rules alike (docs/demo.md, 'The skill
    the policy reads is the skill the analyzers write')."""
    analyzer = OracleAnalyzer(skill_mode)
    return [analyzer.analyze([game.success, *game.failures]) for game in replays]


# ----------------------------------------------------------------------------------------------- start


@dataclass
class SFTStart:
    """What SFT starts from: the same on every rank of a sharded run."""

    model: torch.nn.Module  # fp32, on the run's device, not yet sharded
    tokenizer: Any
    examples: list[sft_data.SFTExample]
    counts: dict[str, Any]
    games: int


def _data_and_tokenizer(cfg: Config, pairs_file: Path | None) -> tuple[Any, list, dict[str, Any], int]:
    """(tokenizer, examples, counts, games): the walkthrough replays, the tokenizer (a tiny model's trained on
    their text and written to <run_dir>/tokenizer) and the examples."""
    replays = walkthrough_replays(cfg) if cfg.sft.behaviour_cloning else []
    corpus: list[str] = []
    if base_policy_path(cfg) is None:  # a tiny decoder: its tokenizer is trained on the replays' text
        pairs = sft_data.read_pairs(pairs_file) if pairs_file is not None else []
        # made-up names stay out of the tokenizer: they must split into word pieces, as an unseen object's
        # name does, or each becomes a token of its own that nothing else trains; TextWorld's own names are
        # words of the game's language, learned like the rest of it
        shown = replays if cfg.sft.rename_names == "textworld" else [
            g for g in replays if "renamed" not in g.success.meta]
        corpus = tokenizer_corpus(shown, pairs, prompt_style(cfg), cfg.skill.skill_mode)
    tokenizer = initial_tokenizer(cfg, corpus)
    examples, counts = sft_examples(cfg, tokenizer, replays, pairs_file)
    return tokenizer, examples, counts, len(replays)


def _from_rank0(make: Callable[[], Any]) -> Any:
    """make() on rank 0, its result sent to every rank (pickled); an error on rank 0 ends every rank."""
    import torch.distributed as dist

    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", make())
        except Exception as err:
            box[0] = ("error", f"{type(err).__name__}: {err}")
            dist.broadcast_object_list(box, src=0)
            raise
    dist.broadcast_object_list(box, src=0)
    status, value = box[0]
    if status == "error":
        raise RuntimeError(f"rank 0 failed to prepare the SFT data: {value}")
    return value


def sft_start(cfg: Config, device: torch.device, sharding: Sharding | None = None) -> SFTStart:
    """The examples, tokenizer and initial model of `seedfast sft`.

    Sharded (a started process group), rank 0 alone replays the games, trains and writes the tokenizer and
    builds the examples, and sends them to the others (one source: nothing depends on each process hashing or
    iterating alike); every rank then builds the model, and a from-scratch model's weights are overwritten by
    rank 0's (a broadcast), so the ranks start from the same weights whatever their devices' initializers do
    (tests/distributed/test_sft_sharded.py). A model.path policy is read from the same files by every rank."""
    pairs_file = pairs_path(cfg)
    if pairs_file is None and not cfg.sft.behaviour_cloning:
        raise ConfigError(NO_DATA)
    base = base_policy_path(cfg)  # before the data: a wrong model.path fails first
    if sharding is None:
        tokenizer, examples, counts, games = _data_and_tokenizer(cfg, pairs_file)
    else:
        tokenizer, examples, counts, games = _from_rank0(lambda: _data_and_tokenizer(cfg, pairs_file))
    model = initial_model(cfg, tokenizer).to(device)
    if sharding is not None and base is None:
        import torch.distributed as dist

        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t.data, src=0)
    return SFTStart(model, tokenizer, examples, counts, games)


def metrics_logger(cfg: Config, is_main: bool = True) -> MetricsLogger | NullLogger:
    """Rank 0's log of `seedfast sft`: <run_dir>/sft_metrics.jsonl started afresh, each step's scalars also to
    TensorBoard in <run_dir>/tb/sft (log.tensorboard; RL's are in its own run folder's tb/) and to W&B
    (log.wandb_project). The other ranks log nothing."""
    if not is_main:
        return NullLogger()
    paths = RunPaths.of(cfg)
    return MetricsLogger(paths.root, tensorboard=cfg.log.tensorboard, wandb_project=cfg.log.wandb_project,
                         path=paths.sft_metrics, tb_dir=paths.sft_tb, fresh=True)


def _log_step(log: MetricsLogger | NullLogger) -> Callable[[dict[str, Any]], None]:
    """train_sft's log_fn: its row {"step": n, ...} as a step of `log`."""
    return lambda row: log.log(row["step"], {k: v for k, v in row.items() if k != "step"})


def main(cfg: Config, sharding: Sharding | None = None, **_flags: Any) -> int:
    """Entry point of `seedfast sft CONFIG`: one process, or (with `sharding`, built by app/sft.py under torchrun)
    one rank of a sharded run: the same steps, each rank training on its share; rank 0 alone writes the metrics
    and the output folder (gathered from every rank)."""
    from seedfast.runtime.setup import device_of, require_one_process

    if sharding is None:
        require_one_process("sft")
    torch.manual_seed(cfg.run.seed)
    t = time.perf_counter()
    start = sft_start(cfg, device_of(cfg), sharding)
    prepare_s = time.perf_counter() - t  # replays, tokenizer, examples, initial model: the log's "data" event
    is_main = sharding is None or sharding.is_main
    log = metrics_logger(cfg, is_main)  # after the data: a config error leaves the last run's metrics alone
    try:
        stats, out = _train_and_save(cfg, start, sharding, log, prepare_s)
    finally:
        log.close()
    if is_main:
        losses = f"loss {stats.first_loss:.3f} -> {stats.last_loss:.3f}" if stats.steps else "no step"
        print(f"sft: {stats.steps} steps ({stats.epochs:.2f} epochs, {stats.elapsed_s:.0f} s) on "
              f"{start.counts['examples']} examples, {losses}; saved {out}")
    return 0


def _train_and_save(cfg: Config, start: SFTStart, sharding: Sharding | None,
                    log: MetricsLogger | NullLogger, prepare_s: float) -> tuple[SFTStats, Path]:
    """main's training from `start` and the saved policy: (the stats, the output folder)."""
    from seedfast.model.lora import has_lora
    from seedfast.runtime.adapters import attach_adapters, uses_lora
    from seedfast.runtime.precision import DTYPES
    from seedfast.runtime.setup import trainable_policy

    model, tokenizer, examples = start.model, start.tokenizer, start.examples
    base = base_policy_path(cfg)
    if uses_lora(cfg) and base is not None:  # adapters on the pretrained base (runtime/adapters.py); a decoder
        # built from scratch trains every weight: low-rank updates of random weights teach it nothing
        model = attach_adapters(cfg, model.to(DTYPES[cfg.model.dtype]), base=base)
    else:
        model = model.to(DTYPES[cfg.optim.master_dtype])  # the trained weights (runtime/precision.py)
    if sharding is not None and sharding.shard is not None:
        model = sharding.shard(model)  # FSDP2 computes in model.dtype over these masters
    compute, masters = (model, None) if has_lora(model) else trainable_policy(cfg, model)
    is_main = sharding is None or sharding.is_main

    log.event({"event": "data", "games": start.games, **start.counts, "wall_s": prepare_s})
    if cfg.sft.copy_warmup_steps:
        t = time.perf_counter()
        last = copy_warmup(compute, ordinary_ids(tokenizer), cfg.sft.copy_warmup_steps, lr=cfg.sft.lr,
                           seed=cfg.run.seed, sharding=sharding, masters=masters)
        log.event({"event": "copy_warmup", "steps": cfg.sft.copy_warmup_steps, "loss": last,
                   "wall_s": time.perf_counter() - t})
    stats: SFTStats = train_sft(compute, examples, cfg.sft, seed=cfg.run.seed, log_fn=_log_step(log),
                                progress=shows_progress(cfg, is_main), masters=masters, sharding=sharding,
                                grad_clip=cfg.optim.grad_clip, betas=tuple(cfg.optim.betas), eps=cfg.optim.eps)
    out = RunPaths.of(cfg).sft
    if sharding is None:
        save_policy(model.cpu(), tokenizer, out, DTYPES[cfg.model.dtype])
    else:
        import torch.distributed as dist

        if sharding.full_state is None:
            raise ValueError("main: a sharded run needs sharding.full_state to gather the weights")
        state = sharding.full_state(model)  # a collective: every rank gathers, rank 0 holds the result
        if is_main:
            if has_lora(model):  # the base and the adapters gathered: merged, as one process saves them
                from seedfast.model.lora import lora_spec_of, merge_state

                state = merge_state(state, lora_spec_of(model))
            save_policy(model, tokenizer, out, DTYPES[cfg.model.dtype], state=state)
        dist.barrier()  # no rank ends before the folder is in place
    log.event({"event": "done", **vars(stats), "out": str(out)})
    return stats, out
