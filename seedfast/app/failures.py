"""How a command ends when something fails: one `seedfast <command>: <kind>: <what>` line on stderr, a documented
exit code, the traceback appended to the run folder's errors.log (or printed too, with --debug), and for SIGINT and
SIGTERM the step a `--resume auto` continues from (docs/reference.md, 'Exit codes').

The exception types are looked up by module and name, so seedfast/cli.py stays free of torch until a command runs.
"""

from __future__ import annotations

import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from seedfast.config import Config
from seedfast.runtime.paths import RunPaths

EXIT_OK = 0
EXIT_INTERNAL = 1  # a bug: anything not below
EXIT_CONFIG = 2  # a bad config or command line (cli.py)
EXIT_LOAD = 3  # a checkpoint, policy or game file missing or damaged
EXIT_NUMERIC = 4  # non-finite losses: trainer.max_bad_steps in a row
EXIT_ENVIRONMENT = 5  # the environments failed so that the run cannot go on
EXIT_DISK = 6  # a write failed: no space left, a file-size limit, another OS error


@dataclass(frozen=True)
class Kind:
    module: str
    name: str
    code: int
    label: str


# first match wins: subclasses before the classes they derive from
KINDS = (
    Kind("seedfast.config.schema", "ConfigError", EXIT_CONFIG, "config error"),
    Kind("seedfast.runtime.checkpoint_files", "CheckpointWriteError", EXIT_DISK, "disk error"),
    Kind("seedfast.runtime.checkpoint_files", "CheckpointError", EXIT_LOAD, "checkpoint error"),
    Kind("seedfast.model.hf_io", "WeightsFileError", EXIT_LOAD, "load error"),
    Kind("seedfast.envs.failures", "GameFileError", EXIT_LOAD, "game file error"),
    Kind("seedfast.envs.failures", "EnvironmentFailure", EXIT_ENVIRONMENT, "environment failure"),
    Kind("seedfast.train.async_rollout", "RolloutProducerError", EXIT_ENVIRONMENT, "rollout producer failure"),
    Kind("builtins", "FloatingPointError", EXIT_NUMERIC, "numeric error"),
    Kind("builtins", "OSError", EXIT_DISK, "OS error"),
)


class StopRequested(BaseException):
    """SIGTERM, raised in the main thread like SIGINT's KeyboardInterrupt, so every `finally` and the checkpoint
    writer's cleanup run (a BaseException: no `except Exception` swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _matches(err: BaseException, kind: Kind) -> bool:
    module = sys.modules.get(kind.module)
    cls = getattr(module, kind.name, None) if module is not None else None
    return isinstance(cls, type) and isinstance(err, cls)


def classify(err: BaseException) -> tuple[int, str]:
    """(exit code, label) of a failure."""
    for kind in KINDS:
        if _matches(err, kind):
            return kind.code, kind.label
    return EXIT_INTERNAL, f"internal error ({type(err).__name__})"


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def describe(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror:  # without "[Errno N]"; the file named once
        named = err.filename is not None and str(err.filename) not in str(err.strerror)
        return one_line(f"{err.strerror}: {err.filename}" if named else err.strerror)
    return one_line(str(err) or type(err).__name__)


def log_traceback(cfg: Config, command: str, argv: list[str], err: BaseException) -> Path | None:
    """Append the traceback of `err` to the run folder's errors.log; its path, or None when it cannot be written
    (the disk that failed may be the run folder's)."""
    path = RunPaths.of(cfg).error_log
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} seedfast {command} {' '.join(argv)}\n")
            f.write("".join(traceback.format_exception(err)))
    except OSError:
        return None
    return path


def report_failure(cfg: Config, command: str, argv: list[str], err: BaseException, debug: bool) -> int:
    """Print the one line of `err`, log its traceback; returns the exit code."""
    code, label = classify(err)
    logged = log_traceback(cfg, command, argv, err)
    where = f" (traceback: {logged})" if logged is not None else ""
    if debug or logged is None:
        traceback.print_exception(err, file=sys.stderr)
    print(f"seedfast {command}: {label}: {describe(err)}{where}", file=sys.stderr, flush=True)
    return code


def resume_point(cfg: Config) -> str:
    """Where a `--resume auto` of this run starts: its newest complete checkpoint."""
    from seedfast.runtime.checkpoint import list_checkpoints

    ckpts = list_checkpoints(RunPaths.of(cfg).ckpt)
    if not ckpts:
        return "no checkpoint yet: a resume starts from step 0"
    return f"resume point: {ckpts[-1]} (step {ckpts[-1].name.removeprefix('step_')}; --resume auto)"


def report_stop(cfg: Config, command: str, signum: int) -> int:
    """The line of a run stopped by SIGINT or SIGTERM; returns 128 + the signal number."""
    name = signal.Signals(signum).name
    where = f"; {resume_point(cfg)}" if command in ("train", "demo") else ""
    print(f"seedfast {command}: stopped by {name}{where}", file=sys.stderr, flush=True)
    return 128 + signum


class SignalsStop:
    """While the command runs: SIGTERM raises StopRequested in the main thread (SIGINT raises KeyboardInterrupt
    already); the previous handler comes back after."""

    def __enter__(self) -> SignalsStop:
        self._previous: Callable[..., Any] | int | None = None
        try:
            self._previous = signal.signal(signal.SIGTERM, self._raise)
        except ValueError:  # not the main thread: leave signals alone
            self._previous = None
        return self

    @staticmethod
    def _raise(signum: int, frame: FrameType | None) -> None:
        raise StopRequested(signum)

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
