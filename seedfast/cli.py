"""`seedfast <command> [CONFIG] [key=value ...] [flags]`: load the config, hand it to the command.

Each command's implementation lives in its own module of seedfast/app/ and is imported only when the command runs,
so `--help` and config errors are instant and need neither torch nor a GPU. An implementation is
`main(cfg: Config, **flags) -> int | None`, where `flags` are the command's own options that are not
config keys (e.g. `split` for eval).

A command that fails after its config is checked ends with one `seedfast <command>: <kind>: <what>` line and the
exit code of its kind, its traceback in the run folder's errors.log; SIGINT and SIGTERM stop it cleanly with 130
and 143 (seedfast/app/failures.py; docs/reference.md, 'Exit codes'). Warnings print as one line each too.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seedfast import __version__
from seedfast.app import end_command
from seedfast.app.host_memory import keep_freed_memory
from seedfast.config import Config, ConfigError, load_config, options_help


@dataclass(frozen=True)
class Command:
    module: str
    attr: str
    help: str


COMMANDS: dict[str, Command] = {
    "envs": Command("seedfast.app.envs", "main", "generate (TextWorld) or check (ALFWorld) the games"),
    "collect": Command("seedfast.app.collect", "main",
                       "stage 1: roll out the base policy, label trajectories with the analyzer (JSONL)"),
    "sft": Command("seedfast.app.sft", "main", "supervised fine-tuning: skill writing (+ behaviour cloning)"),
    "train": Command("seedfast.app.train", "main",
                     "RL: grpo | sdar | seed | grsd (one process, or FSDP2 under torchrun)"),
    "eval": Command("seedfast.app.evaluate", "main", "evaluate a run's policy on the train or eval games"),
    "plan": Command("seedfast.app.plan", "main",
                    "per-GPU memory of the run on N GPUs (meta device, fake process group): before booking"),
    "demo": Command("seedfast.app.demo", "main",
                    "CPU demo: games, tokenizer, tiny model SFT, SEED and GRPO, eval, report"),
}
# Commands that read no run config: their own arguments only; an implementation is `main(**args) -> int | None`.
TOOLS: dict[str, Command] = {
    "models": Command("seedfast.app.models", "main",
                      "fetch a pretrained model into the local cache as an HF folder: models fetch smollm2-135m"),
}
SHOW_CONFIG = "config"
ENV_KINDS = ("textworld", "alfworld", "scienceworld")
ENV_ACTIONS = ("make", "list")  # `seedfast envs make|list ...`


def _top_parser() -> argparse.ArgumentParser:
    commands = "\n".join(f"  {name:<9}{c.help}" for name, c in {**COMMANDS, **TOOLS}.items())
    p = argparse.ArgumentParser(
        prog="seedfast",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Agentic RL with on-policy self-distillation (GRPO, SDAR, SEED, GRSD).",
        epilog=f"commands:\n{commands}\n  {SHOW_CONFIG:<9}print the resolved config as YAML\n\n"
               "`seedfast <command> --help` lists every config option with its default.",
    )
    p.add_argument("--version", action="version", version=f"seedfast {__version__}")
    p.add_argument("command", choices=[*COMMANDS, *TOOLS, SHOW_CONFIG], metavar="command")
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return p


def _command_parser(name: str) -> argparse.ArgumentParser:
    about = COMMANDS[name].help if name in COMMANDS else "print the resolved config as YAML"
    p = argparse.ArgumentParser(
        prog=f"seedfast {name}" + (" make|list" if name == "envs" else ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=about,
        usage=f"seedfast {name}{' make|list [textworld|alfworld|scienceworld]' if name == 'envs' else ''} "
              "[CONFIG] [key=value ...] [options]",
        epilog="config options (in the YAML file, or as key=value overrides):\n" + options_help(),
    )
    p.add_argument("items", nargs="*", metavar="CONFIG | key=value",
                   help="a YAML config (or a run folder holding config.yaml), then dotted overrides")
    p.add_argument("--debug", action="store_true", default=None,
                   help="on a failure, print the traceback too (it always goes to <run_dir>/errors.log)")
    if name == "envs":
        p.add_argument("--type", dest="env.game_type", help="env.game_type, e.g. treasure_hunter")
        p.add_argument("--levels", dest="env.levels", help="env.levels, e.g. 1-5")
        p.add_argument("--train", dest="env.n_train", help="env.n_train: training games")
        p.add_argument("--eval", dest="env.n_eval", help="env.n_eval: evaluation games")
        p.add_argument("--out", dest="env.games_dir", help="env.games_dir")
    if name == "train":
        p.add_argument("--resume", dest="trainer.resume", metavar="auto|PATH",
                       help="trainer.resume: auto = newest checkpoint of this run")
    if name == "train":
        p.add_argument("--profile-steps", dest="trainer.profile_steps", metavar="A:B",
                       help="trainer.profile_steps: capture steps A through B")
    if name == "plan":
        p.add_argument("--world", type=int, help="GPUs (ranks) to plan for; default dist.dp_shard x dist.tp")
        p.add_argument("--json", dest="json_path", metavar="PATH",
                       help="where the JSON goes; default <run_dir>/plan_world<N>_tp<T>.json")
    if name == "eval":
        p.add_argument("--split", choices=("train", "eval", "test"), default="eval",
                       help="games to evaluate on (test: ScienceWorld's held-out test variations; its eval is dev)")
        p.add_argument("--per-game", dest="per_game", action="store_true", default=None,
                       help="add every play (game id, won, steps, actions) to the JSON: paired comparisons")
    return p


def _models_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="seedfast models", description=TOOLS["models"].help,
                                usage="seedfast models fetch NAME [--dir DIR] [--force] | seedfast models list")
    p.add_argument("action", choices=("fetch", "list"))
    p.add_argument("name", nargs="?", help="the model to fetch (`seedfast models list` names them)")
    p.add_argument("--dir", dest="cache_dir", metavar="DIR", help="the cache folder; default .cache/models")
    p.add_argument("--force", action="store_true", help="download and convert again even when cached")
    return p


def _run_models(argv: Sequence[str]) -> int:
    args = _models_parser().parse_args(argv)
    if args.action == "fetch" and not args.name:
        print("seedfast models fetch: which model? (`seedfast models list` names them)", file=sys.stderr)
        return 2
    tool = TOOLS["models"]
    return int(getattr(importlib.import_module(tool.module), tool.attr)(**vars(args)) or 0)


def _split_items(name: str, items: Sequence[str]) -> tuple[str | None, list[str]]:
    """Positional arguments -> (config path or None, dotted overrides)."""
    path, overrides = None, []
    for i, item in enumerate(items):
        if "=" in item:
            overrides.append(item)
        elif name == "envs" and i == 0 and item in ENV_ACTIONS:
            continue
        elif name == "envs" and item in ENV_KINDS and not Path(item).exists():
            overrides.append(f"env.kind={item}")
        elif path is None:
            path = item
        else:
            raise ConfigError(f"expected one config path, got {path!r} and {item!r} "
                              "(overrides look like key=value)")
    return path, overrides


def _resolve(name: str, args: argparse.Namespace) -> tuple[Config, dict[str, Any]]:
    if name == "envs" and (not args.items or args.items[0] not in ENV_ACTIONS):
        raise ConfigError("usage: seedfast envs make|list [textworld|alfworld|scienceworld] [CONFIG] [key=value ...]")
    path, overrides = _split_items(name, args.items)
    flags: dict[str, Any] = {"action": args.items[0]} if name == "envs" else {}
    for dest, value in vars(args).items():
        if dest == "items" or value is None:
            continue
        if "." in dest:
            overrides.append(f"{dest}={value}")
        else:
            flags[dest] = value
    # plan runs nothing of the config: it checks it like `seedfast config` does, not like the command it plans
    cfg = load_config(path, overrides, command=None if name == "plan" else name)
    return cfg, flags


def entry() -> int:
    """The `seedfast` program (its console script, `python -m seedfast`, `torchrun -m seedfast`): the process is
    seedfast's own, so glibc's malloc is set to keep what it frees first (app/host_memory.py), then main() runs.
    main() called from another program leaves that program's malloc as it was."""
    try:
        keep_freed_memory()
    except ValueError as err:  # a MALLOC_* variable of the user's that glibc cannot take
        print(f"seedfast: {err}", file=sys.stderr)
        return 2
    return main()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    if not argv:
        top.print_help(sys.stderr)
        return 2
    ns = top.parse_args(argv)
    name = ns.command
    if name == "models":
        return _run_models(ns.rest)
    args = _command_parser(name).parse_intermixed_args(ns.rest)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cfg, flags = _resolve(name, args)
        for w in caught:
            print(f"seedfast {name}: warning: {w.message}", file=sys.stderr)
        if name == SHOW_CONFIG:
            print(cfg.to_yaml(), end="")
            return 0
        return _run_command(name, cfg, flags, argv)
    except ConfigError as e:
        print(f"seedfast {name}: config error: {e}", file=sys.stderr)
        return 2


def _print_warning(command: str) -> Any:
    def show(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> None:
        print(f"seedfast {command}: warning: {' '.join(str(message).split())}", file=sys.stderr, flush=True)

    return show


def _run_command(name: str, cfg: Config, flags: dict[str, Any], argv: list[str]) -> int:
    """Run the command; a failure or a stop signal becomes its one line and exit code (app/failures.py)."""
    from seedfast.app import failures

    debug = bool(flags.pop("debug", False))
    command = COMMANDS[name]
    run = getattr(importlib.import_module(command.module), command.attr)  # a broken install raises as it is
    completed = False
    with warnings.catch_warnings(), failures.SignalsStop():
        warnings.showwarning = _print_warning(name)
        try:
            code = int(run(cfg, **flags) or 0)
            completed = True
            return code
        except ConfigError:
            raise
        except KeyboardInterrupt:
            return failures.report_stop(cfg, name, failures.signal.SIGINT)
        except failures.StopRequested as stop:
            return failures.report_stop(cfg, name, stop.signum)
        except Exception as err:  # noqa: BLE001 - every failure gets its line and exit code
            return failures.report_failure(cfg, name, argv, err, debug)
        finally:
            end_command(completed)
