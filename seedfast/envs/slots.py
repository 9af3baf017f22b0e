"""Environments addressed by slot, as the agent loop drives them: a worker pool, or in-process.

`reset({slot: spec})` starts an episode of the environment `spec` names (a game path) in each slot and
returns an Observation, or a str saying why it failed; `step({slot: action})` returns
(observation, reward, done, info) per slot, `info["error"]` marking a failed environment. Failures come
back as values, never as exceptions, so one broken game never stops a rollout.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from seedfast.envs.base import Environment, Observation
from seedfast.envs.failures import SIMULATOR_FAILURE_KINDS, SimulatorFailure
from seedfast.envs.workers import FAILURE_KINDS, EnvPool

StepOut = tuple[Observation, float, bool, dict]
COUNTER_KEYS = ("worker_restarts", "restored", *(f"failed_{kind}" for kind in FAILURE_KINDS),
                *(f"failed_simulator_{kind}" for kind in SIMULATOR_FAILURE_KINDS))
log = logging.getLogger(__name__)


def counter_delta(before: Mapping[str, int], after: Mapping[str, int], prefix: str) -> dict[str, float]:
    """What the slots' cumulative counters (`counters()`) moved between two readings, as metrics."""
    return {f"{prefix}{key}": float(after[key] - before.get(key, 0)) for key in after}


def counters_of(envs: Any) -> dict[str, int]:
    """`envs.counters()`, or nothing for slots that keep no counters."""
    counters = getattr(envs, "counters", None)
    return counters() if counters is not None else {}


class EnvSlots(Protocol):
    n_slots: int

    def reset(self, specs: Mapping[int, Any]) -> dict[int, Observation | str]: ...

    def step(self, actions: Mapping[int, str]) -> dict[int, StepOut]: ...


class PoolEnvSlots:
    """Slots backed by seedfast.envs.workers.EnvPool (a few worker processes, per-step timeouts, restarts)."""

    def __init__(self, pool: EnvPool) -> None:
        self.pool = pool
        self.n_slots = pool.n_slots

    def reset(self, specs: Mapping[int, Any]) -> dict[int, Observation | str]:
        results = self.pool.reset(dict(specs))
        return {slot: t.info["error"] if "error" in t.info else t.observation for slot, t in results.items()}

    def step(self, actions: Mapping[int, str]) -> dict[int, StepOut]:
        results = self.pool.step(dict(actions))
        return {slot: (t.observation, t.reward, t.done, t.info) for slot, t in results.items()}

    def counters(self) -> dict[str, int]:
        return self.pool.counters()

    @property
    def failed_games(self) -> Counter[str]:
        return self.pool.failed_games

    def close(self) -> None:
        self.pool.close()


class LocalEnvSlots:
    """`n_slots` environments built by `make_env(spec)` in this process and stepped one after the other."""

    def __init__(self, make_env: Callable[[Any], Environment], n_slots: int) -> None:
        if not isinstance(n_slots, int) or n_slots < 1:
            raise ValueError(f"n_slots must be a positive int, got {n_slots!r}")
        self._make_env = make_env
        self.n_slots = n_slots
        self._envs: dict[int, tuple[Any, Environment]] = {}
        self._failed = 0
        self._simulator_failed: Counter[str] = Counter()
        self.failed_games: Counter[str] = Counter()  # failed episodes per game, as EnvPool counts them

    def reset(self, specs: Mapping[int, Any]) -> dict[int, Observation | str]:
        out: dict[int, Observation | str] = {}
        for slot, spec in specs.items():
            try:
                if slot not in self._envs or self._envs[slot][0] != spec:
                    self._close(slot)
                    self._envs[slot] = (spec, self._make_env(spec))
                out[slot] = self._envs[slot][1].reset()
            except Exception as err:  # reported as a failed episode, never raised
                self._envs.pop(slot, None)
                out[slot] = self._failure(spec, err)
        return out

    def step(self, actions: Mapping[int, str]) -> dict[int, StepOut]:
        out: dict[int, StepOut] = {}
        for slot, action in actions.items():
            try:
                out[slot] = self._envs[slot][1].step(action)
                _, _, done, info = out[slot]
                if done and info.get("failure") in SIMULATOR_FAILURE_KINDS:  # as EnvPool counts them
                    self._simulator_failed[info["failure"]] += 1
                    self.failed_games[str(self._envs[slot][0])] += 1
            except Exception as err:
                error = self._failure(self._envs[slot][0] if slot in self._envs else "?", err)
                out[slot] = (Observation("", ""), 0.0, True, {"won": False, "error": error})
        return out

    def _failure(self, spec: Any, err: Exception) -> str:
        kind = f"simulator_{err.kind}" if isinstance(err, SimulatorFailure) else "exception"  # as EnvPool counts them
        if isinstance(err, SimulatorFailure):
            self._simulator_failed[err.kind] += 1
        else:
            self._failed += 1
        self.failed_games[str(spec)] += 1
        error = f"{type(err).__name__}: {err}"
        log.warning("environment failed (%s) playing %s: %s", kind, spec, error.splitlines()[0] if error else "")
        return error

    def counters(self) -> dict[str, int]:
        """The keys of EnvPool.counters(); in one process nothing but the environment (or its simulator) can fail."""
        return {**dict.fromkeys(COUNTER_KEYS, 0), "failed_exception": self._failed,
                **{f"failed_simulator_{kind}": n for kind, n in self._simulator_failed.items()}}

    def close(self) -> None:
        for slot in list(self._envs):
            self._close(slot)

    def _close(self, slot: int) -> None:
        if slot in self._envs:
            self._envs.pop(slot)[1].close()

    def __enter__(self) -> LocalEnvSlots:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
