"""A pool of environment worker processes with bounded waits.

Each slot is one process holding one environment. The parent talks to it over a pipe and never waits
longer than the step (or reset) timeout. A worker that crashes, hangs or raises ends its slot's
trajectory as a failure (`done=True`, `info["error"]`), is counted in `failures`, and a crashed or hung
worker is replaced by a fresh process, so the next `reset` on that slot works again.

    with EnvPool(n_workers=8, step_timeout=30) as pool:
        first = pool.reset(game_paths)                 # slot i plays game_paths[i]
        out = pool.step({0: "go north", 3: "look"})    # only the slots still playing

Workers start through multiprocessing's forkserver (spawn where there is none), so a script that makes a
pool needs the usual `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import logging
import signal
import time
import traceback
import weakref
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from seedfast.envs._mp import worker_context
from seedfast.envs.base import Environment, Observation, normalize_action

log = logging.getLogger(__name__)
FAILURE_KINDS = ("crash", "timeout", "exception")


@dataclass
class Transition:
    observation: Observation
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


def _default_factory(spec: Any) -> Environment:
    from seedfast.envs.textworld_env import TextWorldEnv

    return TextWorldEnv(spec)


def _worker_main(conn: Connection, env_factory: Callable[[Any], Environment]) -> None:
    """Serve ("reset", spec) / ("step", action) / ("close", None) until told to stop or the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    env, env_spec = None, None
    while True:
        try:
            command, arg = conn.recv()
        except (EOFError, OSError):
            break
        if command == "close":
            break
        try:
            if command == "reset":
                if env is None or arg != env_spec:
                    if env is not None:
                        env.close()
                    env, env_spec = None, None
                    env = env_factory(arg)
                    env_spec = arg
                reply = env.reset()
            elif command == "step":
                if env is None:
                    raise RuntimeError("no environment in this worker: reset it first")
                reply = env.step(arg)
            else:
                raise ValueError(f"unknown command {command!r}")
            conn.send(("ok", reply))
        except Exception as err:  # the environment's failure, reported to the parent
            env, env_spec = None, None
            conn.send(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=4)}"))
    if env is not None:
        env.close()


class _Worker:
    def __init__(self, ctx: Any, env_factory: Callable[[Any], Environment]):
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child_conn, env_factory), daemon=True)
        self.process.start()
        child_conn.close()  # so that the worker's death shows up as EOF on our end

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


def _shutdown(workers: list[_Worker]) -> None:
    for worker in workers:
        try:
            worker.conn.send(("close", None))
        except OSError:
            pass
    deadline = time.monotonic() + 2.0
    for worker in workers:
        worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
        worker.kill()


class EnvPool:
    """`n_workers` environment processes; `env_factory(spec)` builds the environment a reset asks for
    (default: `TextWorldEnv(game_path)`). The factory must be importable by name (not a lambda)."""

    def __init__(self, n_workers: int, env_factory: Callable[[Any], Environment] | None = None,
                 step_timeout: float = 30.0, reset_timeout: float = 120.0, start_method: str | None = None):
        if not isinstance(n_workers, int) or n_workers < 1:
            raise ValueError(f"n_workers must be a positive int, got {n_workers!r}")
        for name, value in (("step_timeout", step_timeout), ("reset_timeout", reset_timeout)):
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        self.env_factory = env_factory or _default_factory
        self.step_timeout, self.reset_timeout = float(step_timeout), float(reset_timeout)
        preload = ["seedfast.envs.workers", "seedfast.envs.textworld_env"]
        if self.env_factory.__module__ not in (*preload, "__main__"):
            preload.append(self.env_factory.__module__)
        self._ctx = worker_context(start_method, preload=preload)
        self.failures: Counter[str] = Counter({kind: 0 for kind in FAILURE_KINDS})
        self.n_restarts = 0
        self._last: list[Observation | None] = [None] * n_workers
        self._workers = [_Worker(self._ctx, self.env_factory) for _ in range(n_workers)]
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)

    @property
    def n_workers(self) -> int:
        return len(self._workers)

    def pid(self, slot: int) -> int:
        """The process id of a slot's worker (for monitoring, or for tests that kill it)."""
        return self._workers[self._check_slot(slot)].process.pid

    def reset(self, specs: Sequence[Any] | Mapping[int, Any]) -> dict[int, Transition] | list[Transition]:
        """Start an episode in each named slot; a list in gives a list out (slot i <- specs[i])."""
        requests = self._requests(specs, "specs")
        results = self._exchange("reset", requests, self.reset_timeout)
        for slot, result in results.items():
            if not result.done:
                self._last[slot] = result.observation
        return [results[i] for i in range(len(specs))] if not isinstance(specs, Mapping) else results

    def step(self, actions: Mapping[int, str] | Sequence[str]) -> dict[int, Transition] | list[Transition]:
        """Advance each named slot by one action; a list in gives a list out (slot i <- actions[i])."""
        requests = self._requests(actions, "actions")
        for slot, action in requests.items():
            if not isinstance(action, str):
                raise TypeError(f"actions[{slot}] must be a str, got {type(action).__name__}")
            if self._last[slot] is None:
                raise RuntimeError(f"slot {slot} has no running episode: reset it first")
        results = self._exchange("step", requests, self.step_timeout)
        for slot, result in results.items():
            self._last[slot] = None if result.done else result.observation
        return [results[i] for i in range(len(actions))] if not isinstance(actions, Mapping) else results

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_slot(self, slot: int) -> int:
        if not isinstance(slot, int) or not 0 <= slot < len(self._workers):
            raise ValueError(f"slot {slot!r} is not in [0, {len(self._workers)})")
        return slot

    def _requests(self, items: Sequence[Any] | Mapping[int, Any], name: str) -> dict[int, Any]:
        if not self._finalizer.alive:
            raise RuntimeError("this EnvPool is closed")
        if isinstance(items, Mapping):
            requests = dict(items)
        elif isinstance(items, Sequence) and not isinstance(items, str):
            requests = dict(enumerate(items))
        else:
            raise TypeError(f"{name} must be a sequence or a mapping slot -> value, got {type(items).__name__}")
        if len(requests) > len(self._workers):
            raise ValueError(f"{name} names {len(requests)} slots but the pool has {len(self._workers)} workers")
        for slot in requests:
            self._check_slot(slot)
        return requests

    def _exchange(self, command: str, requests: dict[int, Any], timeout: float) -> dict[int, Transition]:
        results: dict[int, Transition] = {}
        pending: dict[Connection, int] = {}
        for slot, arg in requests.items():
            try:
                self._workers[slot].conn.send((command, arg))
                pending[self._workers[slot].conn] = slot
            except (OSError, ValueError):  # the worker died since its last reply
                results[slot] = self._fail(slot, "crash", self._death_message(slot), command, arg)
        deadline = time.monotonic() + timeout
        while pending:
            ready = wait(list(pending), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for conn in ready:
                slot = pending.pop(conn)
                try:
                    status, payload = conn.recv()
                except (EOFError, OSError):
                    results[slot] = self._fail(slot, "crash", self._death_message(slot), command, requests[slot])
                    continue
                if status == "ok":
                    results[slot] = self._transition(command, payload)
                else:
                    results[slot] = self._fail(slot, "exception", payload, command, requests[slot], restart=False)
        for slot in pending.values():
            message = f"no reply to {command} within {timeout:g}s"
            results[slot] = self._fail(slot, "timeout", message, command, requests[slot])
        return results

    def _death_message(self, slot: int) -> str:
        """Whether the pipe broke on send or on receive, name the exit code (e.g. -9 for SIGKILL)."""
        process = self._workers[slot].process
        process.join(timeout=1.0)
        return f"worker process died (exit code {process.exitcode})"

    @staticmethod
    def _transition(command: str, payload: Any) -> Transition:
        if command == "reset":
            return Transition(observation=payload)
        observation, reward, done, info = payload
        return Transition(observation, float(reward), bool(done), dict(info))

    def _fail(self, slot: int, kind: str, message: str, command: str, arg: Any,
              restart: bool = True) -> Transition:
        """End the slot's episode as a failure; a crashed or hung worker is replaced."""
        self.failures[kind] += 1
        log.warning("environment slot %d failed (%s): %s", slot, kind, message.splitlines()[0])
        if restart:
            self._workers[slot].kill()
            self._workers[slot] = _Worker(self._ctx, self.env_factory)
            self.n_restarts += 1
        last = self._last[slot] if command == "step" else None
        self._last[slot] = None
        valid = False
        if last is not None and isinstance(arg, str):
            # An environment failure is not the policy's fault: judge the action on what it was offered.
            valid = normalize_action(arg) in {normalize_action(a) for a in last.admissible_actions}
        observation = Observation(text="", task=last.task if last else "", admissible_actions=[])
        info = {"won": False, "lost": False, "valid": valid, "error": f"{kind}: {message}"}
        return Transition(observation, 0.0, True, info)
