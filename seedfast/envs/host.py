"""The body of one environment worker process: many environments, addressed by slot, served over a pipe.

The owner sends ("run", [(command, slot, argument), ...]); the worker runs the items in order and answers each
with ("reply", slot, status, payload) as soon as it is done, so that the owner can give every item its own deadline;
status is "ok", or "error" (the environment raised), or "simulator_timeout" / "simulator_crash" (it raised
envs/failures.py's SimulatorFailure). Commands: ("reset", spec) starts an episode (the slot's environment is kept
while its spec stays the same), ("step", action), ("restore", (spec, actions)) builds the environment afresh and
replays an episode, answering with the last observation. ("close", None), or EOF on the pipe, ends the worker.
"""

from __future__ import annotations

import os
import pickle
import signal
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from seedfast.envs.base import Environment
from seedfast.envs.failures import SimulatorFailure
from seedfast.envs.lifeline import die_with_owner

Envs = dict[int, tuple[Any, Environment]]  # slot -> (spec, environment)


def serve(conn: Connection, lifeline: Connection, factory_pickle: bytes) -> None:
    die_with_owner(lifeline)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the owner's to handle
    # unpickled only now, so that importing the environment's package (seconds) runs under die_with_owner
    env_factory = pickle.loads(factory_pickle)
    conn.send(("ready", os.getpid()))
    envs: Envs = {}
    try:
        while True:
            try:
                command, items = conn.recv()
            except (EOFError, OSError):
                return
            if command == "close":
                return
            for item_command, slot, arg in items:
                conn.send(("reply", slot, *run_item(item_command, slot, arg, envs, env_factory)))
    finally:
        for slot in list(envs):
            _drop(envs, slot)


def run_item(command: str, slot: int, arg: Any, envs: Envs, env_factory: Callable[[Any], Environment]
             ) -> tuple[str, Any]:
    """("ok", result), or ("error" | "simulator_<kind>", message); an environment that raised is dropped."""
    try:
        if command == "reset":
            if slot not in envs or envs[slot][0] != arg:
                _drop(envs, slot)
                envs[slot] = (arg, env_factory(arg))
            return "ok", envs[slot][1].reset()
        if command == "step":
            if slot not in envs:
                raise RuntimeError("no environment in this slot: reset it first")
            return "ok", envs[slot][1].step(arg)
        if command == "restore":
            spec, actions = arg
            _drop(envs, slot)
            envs[slot] = (spec, env_factory(spec))
            observation = envs[slot][1].reset()
            for action in actions:
                observation = envs[slot][1].step(action)[0]
            return "ok", observation
        raise ValueError(f"unknown command {command!r}")
    except Exception as err:  # the environment's failure, reported to the owner
        _drop(envs, slot)
        # its simulator's timeout or crash is counted by kind, apart from the worker's (envs/workers.py)
        status = f"simulator_{err.kind}" if isinstance(err, SimulatorFailure) else "error"
        return status, f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=4)}"


def _drop(envs: Envs, slot: int) -> None:
    if slot in envs:
        try:
            envs.pop(slot)[1].close()
        except Exception:  # a broken environment may fail to close; it is gone either way
            pass
