"""Environment slots served by a few worker processes, with bounded waits.

`n_slots` environments live in `processes` worker processes (default: one per usable CPU, never more than the
slots; slot s in worker s % processes), so processes and memory follow the CPUs, not the slots. A worker runs the
items it is sent in order (envs/host.py); each item has its own deadline (step_timeout for a step, reset_timeout
for a reset) counted from the worker's previous reply, so per-step timeouts hold however many slots share a worker.

    with EnvPool(n_slots=128, step_timeout=30) as pool:
        first = pool.reset(game_paths)                 # slot i plays game_paths[i]
        out = pool.step({0: "go north", 3: "look"})    # only the slots still playing

A failed environment ends its slot's episode (`done=True`, `info["error"] = "<kind>: ..."`), counted in `failures`:
- exception: the environment raised; its worker lives on;
- crash / timeout: the worker died, or missed this slot's deadline and was killed; the worker is restarted
  (`n_restarts`) and the other live episodes it held are rebuilt on the new one by replaying them (reset, then the
  actions so far), each checked to end on the observation its slot last returned (`n_restored`);
- lost: the slot's episode was on a restarted worker and its replay failed or ended elsewhere.
An environment that runs a simulator process of its own (ScienceWorld's JVM) may fail an episode itself: its step
answers `done` with `info["failure"]` naming the kind ('timeout' or 'crash'), or its reset raises SimulatorFailure
(envs/failures.py); its worker lives on, and the pool counts it in `simulator_failures` (`failed_simulator_<kind>` in
`counters()`, not `failed_exception`) and `failed_games`.

Workers die with the process that owns the pool, whatever ended it (envs/lifeline.py). They start with the spawn
method by default: their parent is then the owner itself, which PR_SET_PDEATHSIG needs; a script that makes a pool
needs the usual `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import logging
import os
import pickle
import time
import weakref
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from seedfast.envs._mp import worker_context
from seedfast.envs.base import Environment, Observation, normalize_action
from seedfast.envs.failures import SIMULATOR_FAILURE_KINDS
from seedfast.envs.host import serve

log = logging.getLogger(__name__)
FAILURE_KINDS = ("crash", "timeout", "exception", "lost")


@dataclass
class Transition:
    observation: Observation
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _default_factory(spec: Any) -> Environment:
    from seedfast.envs.textworld_env import TextWorldEnv

    return TextWorldEnv(spec)


@dataclass
class _Item:
    command: str  # reset | step | restore
    slot: int
    arg: Any


@dataclass
class _Episode:
    """What the owner keeps of a running episode: enough to replay it on a fresh worker."""

    spec: Any
    last: Observation
    actions: list[str] = field(default_factory=list)
    lost: str | None = None  # why its environment is gone (a worker restart it did not survive)


class _Worker:
    def __init__(self, ctx: Any, factory_pickle: bytes, lifeline: Connection, slots: range) -> None:
        self.ctx, self.factory_pickle, self.lifeline, self.slots = ctx, factory_pickle, lifeline, slots
        self.queue: deque[_Item] = deque()  # sent, not answered yet; the head is running
        self.start(0.0)

    def start(self, start_timeout: float) -> None:
        self.conn, child_conn = self.ctx.Pipe()
        self.process = self.ctx.Process(target=serve, args=(child_conn, self.lifeline, self.factory_pickle),
                                        daemon=True)
        self.process.start()
        child_conn.close()  # so that the worker's death shows up as EOF on our end
        self.ready = False
        self.gave_up = False  # it died before it was ready: the next call tries a fresh one
        self.deadline = time.monotonic() + start_timeout

    def stop(self) -> int | None:
        """Kill the process; its exit code (e.g. -9 for SIGKILL)."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()
        return self.process.exitcode


def _shutdown(workers: list[_Worker], lifeline_w: Connection) -> None:
    for worker in workers:
        try:
            worker.conn.send(("close", None))
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + 2.0
    for worker in workers:
        worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
        worker.stop()
    lifeline_w.close()


class EnvPool:
    """`n_slots` environment slots in `processes` worker processes; `env_factory(spec)` builds the environment a
    reset asks for (default: `TextWorldEnv(game_path)`). The factory must be importable by name (not a lambda)."""

    def __init__(self, n_slots: int, env_factory: Callable[[Any], Environment] | None = None, *,
                 processes: int | None = None, step_timeout: float = 30.0, reset_timeout: float = 120.0,
                 start_method: str | None = None) -> None:
        if isinstance(n_slots, bool) or not isinstance(n_slots, int) or n_slots < 1:
            raise ValueError(f"n_slots must be a positive int, got {n_slots!r}")
        processes = usable_cpus() if processes is None else processes
        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
            raise ValueError(f"processes must be a positive int, got {processes!r}")
        processes = min(processes, n_slots)
        for name, value in (("step_timeout", step_timeout), ("reset_timeout", reset_timeout)):
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if start_method == "fork":
            raise ValueError("start_method='fork' would copy the owner's threads, CUDA state and the lifeline's "
                             "write end into every worker; use 'spawn' or 'forkserver'")
        self.env_factory = env_factory or _default_factory
        self.step_timeout, self.reset_timeout = float(step_timeout), float(reset_timeout)
        preload = ["seedfast.envs.host", "seedfast.envs.textworld_env"]
        if self.env_factory.__module__ not in (*preload, "__main__"):
            preload.append(self.env_factory.__module__)
        ctx = worker_context(start_method or "spawn", preload=preload)
        self.failures: Counter[str] = Counter({kind: 0 for kind in FAILURE_KINDS})
        self.simulator_failures: Counter[str] = Counter({kind: 0 for kind in SIMULATOR_FAILURE_KINDS})
        self.n_restarts = 0
        self.failed_games: Counter[str] = Counter()  # failed episodes per game (its spec: the game file)
        self.n_restored = 0
        self._n_slots = n_slots
        self._episodes: list[_Episode | None] = [None] * n_slots
        lifeline_r, lifeline_w = ctx.Pipe(duplex=False)
        factory_pickle = pickle.dumps(self.env_factory)
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, lifeline_w)
        for i in range(processes):
            self._workers.append(_Worker(ctx, factory_pickle, lifeline_r, range(i, n_slots, processes)))
        self._await_ready()

    @property
    def n_slots(self) -> int:
        return self._n_slots

    @property
    def processes(self) -> int:
        return len(self._workers)

    def pid(self, slot: int) -> int:
        """The process id of the worker hosting `slot` (for monitoring, or for tests that kill it)."""
        return self._worker_of(self._check_slot(slot)).process.pid

    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def counters(self) -> dict[str, int]:
        """Cumulative: worker restarts, environments rebuilt after one, episodes failed per kind (by the pool, and by
        the environment's own simulator)."""
        return {"worker_restarts": self.n_restarts, "restored": self.n_restored,
                **{f"failed_{kind}": self.failures[kind] for kind in FAILURE_KINDS},
                **{f"failed_simulator_{kind}": self.simulator_failures[kind] for kind in SIMULATOR_FAILURE_KINDS}}

    def reset(self, specs: Sequence[Any] | Mapping[int, Any]) -> dict[int, Transition] | list[Transition]:
        """Start an episode in each named slot; a list in gives a list out (slot i <- specs[i])."""
        requests = self._requests(specs, "specs")
        results = self._exchange([_Item("reset", slot, spec) for slot, spec in requests.items()])
        return [results[i] for i in range(len(specs))] if not isinstance(specs, Mapping) else results

    def step(self, actions: Mapping[int, str] | Sequence[str]) -> dict[int, Transition] | list[Transition]:
        """Advance each named slot by one action; a list in gives a list out (slot i <- actions[i])."""
        requests = self._requests(actions, "actions")
        for slot, action in requests.items():
            if not isinstance(action, str):
                raise TypeError(f"actions[{slot}] must be a str, got {type(action).__name__}")
            if self._episodes[slot] is None:
                raise RuntimeError(f"slot {slot} has no running episode: reset it first")
        results = self._exchange([_Item("step", slot, action) for slot, action in requests.items()])
        return [results[i] for i in range(len(actions))] if not isinstance(actions, Mapping) else results

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ requests

    def _check_slot(self, slot: int) -> int:
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self._n_slots:
            raise ValueError(f"slot {slot!r} is not in [0, {self._n_slots})")
        return slot

    def _worker_of(self, slot: int) -> _Worker:
        return self._workers[slot % len(self._workers)]

    def _requests(self, items: Sequence[Any] | Mapping[int, Any], name: str) -> dict[int, Any]:
        if not self._finalizer.alive:
            raise RuntimeError("this EnvPool is closed")
        if isinstance(items, Mapping):
            requests = dict(items)
        elif isinstance(items, Sequence) and not isinstance(items, str):
            requests = dict(enumerate(items))
        else:
            raise TypeError(f"{name} must be a sequence or a mapping slot -> value, got {type(items).__name__}")
        if len(requests) > self._n_slots:
            raise ValueError(f"{name} names {len(requests)} slots but the pool has {self._n_slots} slots")
        for slot in requests:
            self._check_slot(slot)
        return requests

    def _await_ready(self) -> None:
        for worker in self._workers:
            worker.deadline = time.monotonic() + self.reset_timeout
        for worker in self._workers:
            if not worker.conn.poll(max(0.0, worker.deadline - time.monotonic())):
                self.close()
                raise RuntimeError(f"an environment worker did not start within {self.reset_timeout:g}s")
            try:
                worker.conn.recv()
            except (EOFError, OSError):
                self.close()
                raise RuntimeError(f"an environment worker died while starting (exit code "
                                   f"{worker.process.exitcode}); see its traceback above") from None
            worker.ready = True

    # ------------------------------------------------------------------ the exchange with the workers

    def _exchange(self, items: list[_Item]) -> dict[int, Transition]:
        """Send every item to its slot's worker and wait for all answers, each within its own deadline."""
        results: dict[int, Transition] = {}
        for worker in self._workers:
            self._submit(worker, [item for item in items if self._worker_of(item.slot) is worker], results)
        while busy := [w for w in self._workers if w.queue]:
            timeout = max(0.0, min(w.deadline for w in busy) - time.monotonic())
            ready = wait([w.conn for w in busy], timeout=timeout)
            for worker in busy:
                if worker.conn in ready or worker.conn.poll(0):
                    self._receive(worker, results)
                elif worker.deadline <= time.monotonic():
                    self._recover(worker, "timeout", results)
        return results

    def _budget(self, item: _Item) -> float:
        if item.command == "step":
            return self.step_timeout
        if item.command == "reset":
            return self.reset_timeout
        return self.reset_timeout + len(item.arg[1]) * self.step_timeout  # restore: a reset, then a replay

    def _submit(self, worker: _Worker, items: list[_Item], results: dict[int, Transition]) -> None:
        items = [item for item in items if not self._answer_lost(item, results)]
        if not items:
            return
        if not worker.process.is_alive():
            if worker.ready or worker.gave_up:  # it died since its last reply (killed from outside, OOM, ...)
                self._restart(worker, items, results)  # episodes that `items` reset are not replayed
            else:  # a fresh worker that died at once
                worker.queue.extend(items)
                self._recover(worker, "crash", results)
            return
        was_idle = not worker.queue
        worker.queue.extend(items)
        if was_idle and worker.ready:
            worker.deadline = time.monotonic() + self._budget(worker.queue[0])
        try:
            worker.conn.send(("run", [(item.command, item.slot, item.arg) for item in items]))
        except (OSError, ValueError):
            if worker.ready:  # it died idle, between the check above and the send: nothing had started
                self._restart(worker, list(worker.queue), results)
            else:  # a fresh worker that died at once
                self._recover(worker, "crash", results)

    def _answer_lost(self, item: _Item, results: dict[int, Transition]) -> bool:
        episode = self._episodes[item.slot]
        if item.command == "step" and episode is not None and episode.lost:
            results[item.slot] = self._fail(item.slot, "lost", episode.lost, item.command, item.arg)
            return True
        return item.command == "restore" and (episode is None or episode.lost is not None)

    def _receive(self, worker: _Worker, results: dict[int, Transition]) -> None:
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            self._recover(worker, "crash", results)
            return
        if message[0] == "ready":
            worker.ready = True
        else:
            _, slot, status, payload = message
            item = worker.queue.popleft()
            if item.slot != slot:
                raise RuntimeError(f"worker {worker.process.pid} answered slot {slot}, expected {item.slot}")
            self._resolve(item, status, payload, results)
        if worker.queue:
            worker.deadline = time.monotonic() + self._budget(worker.queue[0])

    def _resolve(self, item: _Item, status: str, payload: Any, results: dict[int, Transition]) -> None:
        slot, episode = item.slot, self._episodes[item.slot]
        if item.command == "restore":
            if episode is None:
                return
            if status == "ok" and payload == episode.last:
                self.n_restored += 1
            else:
                why = payload.splitlines()[0] if status != "ok" else "its replay ended on another observation"
                episode.lost = f"could not rebuild the environment after a worker restart: {why}"
            return
        if item.command == "step" and episode is not None and episode.lost:
            results[slot] = self._fail(slot, "lost", episode.lost, item.command, item.arg)
        elif status != "ok":
            results[slot] = self._fail(slot, status if status.startswith("simulator_") else "exception", payload,
                                       item.command, item.arg)
        elif item.command == "reset":
            results[slot] = Transition(observation=payload)
            self._episodes[slot] = _Episode(item.arg, payload)
        else:
            observation, reward, done, info = payload
            results[slot] = Transition(observation, float(reward), bool(done), dict(info))
            kind = info.get("failure") if done else None
            if kind in SIMULATOR_FAILURE_KINDS:
                self.simulator_failures[kind] += 1
                self.failed_games[str(episode.spec if episode is not None else "?")] += 1
            if done:
                self._episodes[slot] = None
            elif episode is not None:
                episode.actions.append(item.arg)
                episode.last = observation

    def _recover(self, worker: _Worker, kind: str, results: dict[int, Transition]) -> None:
        """The worker died or missed a deadline: the item it was running fails, the worker is restarted."""
        code = worker.stop()
        if not worker.ready:  # it never started: restarting it in a loop would not help
            message = f"worker process did not start (exit code {code})"
            for item in worker.queue:
                self._fail_item(item, kind, message, results)
            worker.queue.clear()
            worker.gave_up = True
            return
        head = worker.queue.popleft()
        message = (f"no reply to {head.command} within {self._budget(head):g}s" if kind == "timeout"
                   else f"worker process died (exit code {code})")
        self._fail_item(head, kind, message, results)
        self._restart(worker, list(worker.queue), results, skip=head.slot)

    def _fail_item(self, item: _Item, kind: str, message: str, results: dict[int, Transition]) -> None:
        if item.command == "restore":
            if self._episodes[item.slot] is not None:
                self._episodes[item.slot].lost = f"{kind} while rebuilding its environment: {message}"
        else:
            results[item.slot] = self._fail(item.slot, kind, message, item.command, item.arg)

    def _restart(self, worker: _Worker, pending: list[_Item], results: dict[int, Transition],
                 skip: int | None = None) -> None:
        """A fresh process for `worker`, given the episodes it held (replayed) and then `pending`."""
        if worker.process.is_alive() or not worker.conn.closed:
            worker.stop()
        worker.queue.clear()
        worker.start(self.reset_timeout)
        self.n_restarts += 1
        log.warning("environment worker restarted (%d so far)", self.n_restarts)
        pending = [item for item in pending if item.command != "restore"]
        fresh = {item.slot for item in pending if item.command == "reset"}
        restores = [_Item("restore", slot, (episode.spec, list(episode.actions))) for slot in worker.slots
                    if slot != skip and slot not in fresh and (episode := self._episodes[slot]) is not None
                    and episode.lost is None]
        self._submit(worker, restores + pending, results)

    def _fail(self, slot: int, kind: str, message: str, command: str, arg: Any) -> Transition:
        """End the slot's episode as a failure, named by its game and counted per game (`failed_games`); `kind` is one
        of FAILURE_KINDS, or simulator_<kind> (module docstring)."""
        if kind.startswith("simulator_"):
            self.simulator_failures[kind.removeprefix("simulator_")] += 1
        else:
            self.failures[kind] += 1
        episode = self._episodes[slot]
        game = str(arg if command == "reset" else episode.spec if episode is not None else "?")
        self.failed_games[game] += 1
        log.warning("environment slot %d failed (%s) playing %s: %s", slot, kind, game, message.splitlines()[0])
        last = episode.last if episode is not None and command == "step" else None
        self._episodes[slot] = None
        valid = False
        if last is not None and isinstance(arg, str):
            # An environment failure is not the policy's fault: judge the action on what it was offered.
            valid = normalize_action(arg) in {normalize_action(a) for a in last.admissible_actions}
        observation = Observation(text="", task=last.task if last else "", admissible_actions=[])
        info = {"won": False, "lost": False, "valid": valid, "error": f"{kind}: {message}"}
        return Transition(observation, 0.0, True, info)
