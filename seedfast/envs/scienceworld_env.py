"""ScienceWorld (PyPI `scienceworld`: its simulator jar and task table ship in the wheel; it needs a Java runtime) as
an `Environment`, one JVM per environment.

One episode is one variation of one task under a set of simplifications (`Variation`, the spec a worker's factory
opens). What the agent sees (`Observation`):
- `task`: the task description;
- `text`: the step's feedback, then the room (`look around`, left out when the feedback is that text already), then
  the inventory, cut to `max_chars` characters: the head is kept and the cut is said in the text itself
  ("[... N more characters cut]"), so a long room never pushes the prompt past its budget unseen;
- `admissible_actions`: the simulator's valid action-object combinations, whitespace-normalized, deduplicated by
  `normalize_action` and sorted (so a replayed episode shows the same list).

Reward is 1.0 only when the task is completed (score 100), else 0.0, as for TextWorld: the trainer's outcome reward is
binary success. The simulator's 0-100 partial score is kept in `info["score"]` (ScienceWorld itself gives -100 when
the agent made the task impossible, `info["lost"]`), for logs, not for the reward. Every action reaches the simulator:
its valid-combination list leaves out actions it accepts (e.g. "open door to kitchen" when the door is open, or an
object named without its container), and most gold sequences use some of them; `info["valid"]` is True when the action
is listed, or when the simulator's parser took it (its feedback is not "No known action matches that input.").

The simulator's process: a JVM started here (not by scienceworld's wrapper) with a bounded heap (`heap_mb`, -Xmx) and
the serial collector, that dies with the thread that started it (PR_SET_PDEATHSIG, set between fork and exec) and
exits when its stdin closes (py4j's --die-on-broken-pipe), so it never outlives its owner whatever killed the owner.
Every simulator call runs under a deadline (`call_timeout_s`; `load_timeout_s` for start and load): a watchdog kills
the JVM when it passes, the call fails, the episode ends as failed (`done`, `info["error"] = "timeout: ..."` or
"crash: ..." when the JVM died by itself, `info["failure"]` its kind), the failure is counted (`counters()`, and
`info`'s `simulator_*` keys; the worker pool's `failed_simulator_*` counters),
and the next `reset()` starts a fresh JVM. Its deadline is shorter than the worker pool's step deadline, so the
environment fails the episode before the pool would kill its worker.

A closed environment hands its healthy JVM to the next one its process makes (an idle pool of `MAX_IDLE` per
process), so a worker that moves a slot to another variation reloads the task instead of starting a JVM (seconds).
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from seedfast.envs.base import Observation, check_step, normalize_action
from seedfast.envs.failures import SimulatorFailure

SPLITS = ("train", "dev", "test")
HEAP_MB = 512
MAX_TEXT_CHARS = 2000
MAX_IDLE = 4  # idle JVMs a process keeps for its next environments
# The serial collector: no parallel GC threads per JVM when many JVMs share a few cores, and a smaller footprint.
JVM_OPTIONS = ("-XX:+UseSerialGC", "-Xss1m")
UNKNOWN_ACTION = "No known action matches that input."
# Meta actions the simulator lists but an episode must not use: "reset task" would restart the episode inside it.
HIDDEN_ACTIONS = ("reset task",)
REFUSED_TEXT = "That action is not available in this episode."
SPLITS_FILE = Path(__file__).with_name("scienceworld_splits.json")
_INSTALL_HINT = ("ScienceWorld needs the `scienceworld` package (`pip install scienceworld==1.2.3`, in the `envs` "
                 "extra) and a Java runtime (`apt-get install openjdk-17-jre-headless`; `make install` does both)")
_PR_SET_PDEATHSIG = 1
_CUT = "\n[... {n} more characters cut]"
# What a JVM holds beyond its heap (metaspace, code cache, thread stacks, the collector's tables), in MiB: its resident
# memory right after the start, when the heap is nearly empty (130 MiB measured), rounded up; a slot is budgeted its
# -Xmx plus this, above the peak a slot reached playing gold sequences (467 MiB at -Xmx512m;
# benchmarks/results/scienceworld_jvm.json)
JVM_OVERHEAD_MB = 160
MEMORY_SHARE = 0.5  # of the machine's memory the simulators of one process may take; the trainer needs the rest


@dataclass(frozen=True)
class Variation:
    """One ScienceWorld episode: a task (its name, as `task_names()` gives), a variation index, simplifications
    (comma-separated, as the simulator takes them; '' = none)."""

    task: str
    variation: int
    simplifications: str = ""

    def __str__(self) -> str:
        return f"{self.task}/{self.variation}" + (f"[{self.simplifications}]" if self.simplifications else "")


# ------------------------------------------------------------------------------------------ the task table


def _require_scienceworld() -> Any:
    try:
        import scienceworld.constants as constants
    except ImportError as err:
        raise ImportError(f"{_INSTALL_HINT} ({err})") from err
    return constants


def java_path() -> str:
    """The `java` this machine runs ($JAVA_HOME/bin/java first), or an ImportError saying how to install one."""
    home = Path(os.environ.get("JAVA_HOME") or "/nonexistent") / "bin" / "java"
    found = str(home) if home.is_file() else shutil.which("java")
    if not found:
        raise ImportError(f"no `java` on PATH: {_INSTALL_HINT}")
    return found


@cache
def task_table() -> tuple[dict[str, str], ...]:
    """The wheel's task table: one {task_id, topic, task, task_name} per task (30), no JVM needed."""
    return tuple(dict(t) for t in _require_scienceworld().TASKS)


def task_names() -> list[str]:
    return [t["task_name"] for t in task_table()]


def resolve_task(name: str) -> str:
    """A task's name from its name or id ('1-1' -> 'boil'); ValueError listing the valid names otherwise."""
    by_id = {t["task_id"]: t["task_name"] for t in task_table()}
    key = str(name).strip()
    if key in by_id:
        return by_id[key]
    if key in task_names():
        return key
    raise ValueError(f"unknown ScienceWorld task {name!r}; choose a name or id of: "
                     + ", ".join(f"{t['task_name']} ({t['task_id']})" for t in task_table()))


SIMPLIFICATIONS = ("easy", "teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors",
                   "noElectricalAction")


def check_simplifications(text: str, task: str | None = None) -> str:
    """The simplifications string normalized ('a, b' -> 'a,b'); ValueError naming an unknown one, or
    noElectricalAction (part of 'easy') for a task that needs electrical actions."""
    items = [s.strip() for s in str(text).split(",") if s.strip()]
    for item in items:
        if item not in SIMPLIFICATIONS:
            raise ValueError(f"unknown ScienceWorld simplification {item!r}; choose from {', '.join(SIMPLIFICATIONS)}")
    if task is not None and _electrical(task) and "noElectricalAction" in items:
        raise ValueError(f"task {task!r} needs electrical actions: drop noElectricalAction")
    return ",".join(items)


def _electrical(task: str) -> bool:
    return "power-component" in task or "conductivity" in task


def simplifications_for(task: str, text: str) -> str:
    """What the simulator is given for `task`: 'easy' on an electrical task becomes easy's other simplifications,
    since the simulator refuses noElectricalAction (part of 'easy') there."""
    items = check_simplifications(text).split(",") if text else []
    if _electrical(task) and "easy" in items:
        items = [s for s in items if s != "easy"] + [s for s in SIMPLIFICATIONS[1:-1] if s not in items]
    return ",".join(items)


@cache
def split_table() -> dict[str, dict[str, list[int]]]:
    """{task: {train|dev|test: [variation, ...]}}, the simulator's own split, as committed in SPLITS_FILE
    (`write_split_table` makes it from the jar; tests/scienceworld/ checks it against the jar)."""
    data = json.loads(SPLITS_FILE.read_text(encoding="utf-8"))
    return {task: {split: _expand(runs) for split, runs in splits.items()} for task, splits in data["tasks"].items()}


def variations(task: str, split: str) -> list[int]:
    """The variations of `task` in `split` (train: RL pools and SFT; dev: selection; test: held-out evaluation)."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is not one of {SPLITS}")
    return list(split_table()[resolve_task(task)][split])


def _compress(values: Sequence[int]) -> list[list[int]]:
    """[0, 1, 2, 5] -> [[0, 2], [5, 5]]: inclusive runs, so the committed file stays small."""
    runs: list[list[int]] = []
    for v in sorted(values):
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return runs


def _expand(runs: Sequence[Sequence[int]]) -> list[int]:
    return [v for lo, hi in runs for v in range(lo, hi + 1)]


def write_split_table(path: str | os.PathLike = SPLITS_FILE) -> dict[str, Any]:
    """Read every task's train/dev/test variations from the jar and write them to `path` (runs of indices)."""
    sim = Simulator()
    try:
        tasks = {}
        for name in task_names():
            sim.call(lambda s, n=name: s.load(n, 0, "", False), timeout_s=120)
            tasks[name] = {split: _compress(list(sim.call(lambda s, m=method: getattr(s, m)(), timeout_s=30)))
                           for split, method in (("train", "getVariationsTrain"), ("dev", "getVariationsDev"),
                                                 ("test", "getVariationsTest"))}
    finally:
        sim.kill()
    from scienceworld.version import __version__

    data = {"scienceworld": __version__, "note": "inclusive [first, last] runs of variation indices per split",
            "tasks": tasks}
    Path(path).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    split_table.cache_clear()
    return data


# ------------------------------------------------------------------------------------------ the JVM


def _die_with_parent(parent: int) -> None:
    """preexec_fn of the JVM: the kernel SIGKILLs it when the thread that started it ends, however that ends."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the line above: no signal will come
        os._exit(1)


def _drain(stream: Any) -> None:
    try:
        while stream.read(65536):
            pass
    except (OSError, ValueError):
        pass


class Simulator:
    """One ScienceWorld JVM and its py4j connection; `call(fn, timeout_s)` runs `fn(server)` under a deadline."""

    def __init__(self, heap_mb: int = HEAP_MB, start_timeout_s: float = 60.0) -> None:
        constants = _require_scienceworld()
        from py4j.java_gateway import GatewayParameters, JavaGateway, find_jar_path

        self.heap_mb = int(heap_mb)
        command = [java_path(), f"-Xmx{self.heap_mb}m", *JVM_OPTIONS, "-classpath",
                   os.pathsep.join((find_jar_path(), constants.JAR_PATH)), "py4j.GatewayServer",
                   "--die-on-broken-pipe", "0"]
        self._stderr = tempfile.TemporaryFile()
        parent = os.getpid()
        started = time.monotonic()
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, cwd=constants.BASEPATH,
            preexec_fn=(lambda: _die_with_parent(parent)) if sys.platform.startswith("linux") else None)
        self.pid = self.process.pid
        try:
            port = self._read_port(start_timeout_s)
            # the simulator prints as it runs: a pipe left unread would fill and block it
            threading.Thread(target=_drain, args=(self.process.stdout,), daemon=True).start()
            self._gateway = JavaGateway(gateway_parameters=GatewayParameters(port=port, auto_field=True))
            self.server = self.call(lambda _: self._gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface(),
                                    timeout_s=max(1.0, start_timeout_s - (time.monotonic() - started)))
        except BaseException:
            self.kill()
            raise
        self.start_s = time.monotonic() - started
        self.loaded: tuple[str, int, str, bool] | None = None

    def _read_port(self, timeout_s: float) -> int:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        line = self.process.stdout.readline() if ready else b""
        if not line.strip().isdigit():
            if ready:
                self.process.wait(timeout=5)
            self._stderr.seek(0)
            why = self._stderr.read().decode(errors="replace").strip()[-2000:]
            self.kill()
            raise SimulatorFailure("timeout" if not ready else "crash",
                                   f"the ScienceWorld JVM did not start within {timeout_s:g}s"
                                   + (f": {why}" if why else f" (exit code {self.process.poll()})"))
        return int(line)

    def alive(self) -> bool:
        return self.process.poll() is None

    def call(self, fn: Any, timeout_s: float) -> Any:
        """`fn(server)`; SimulatorFailure('timeout') when it takes longer than `timeout_s` (the JVM is killed, which
        ends the blocked call), SimulatorFailure('crash') when the JVM died or the connection broke."""
        from py4j.protocol import Py4JError, Py4JJavaError, Py4JNetworkError

        if not self.alive():
            raise SimulatorFailure("crash", f"the ScienceWorld JVM (pid {self.pid}) is gone "
                                            f"(exit code {self.process.poll()})")
        fired = threading.Event()

        def watchdog() -> None:
            fired.set()
            self.kill()

        timer = threading.Timer(timeout_s, watchdog)
        timer.daemon = True
        timer.start()
        try:
            out = fn(getattr(self, "server", None))
            if fired.is_set():  # it answered as the watchdog killed it: the JVM is gone all the same
                raise SimulatorFailure("timeout", self._why("timeout", timeout_s, TimeoutError()))
            return out
        except (Py4JNetworkError, OSError, EOFError) as err:
            kind = "timeout" if fired.is_set() else "crash"
            raise SimulatorFailure(kind, self._why(kind, timeout_s, err)) from err
        except Py4JJavaError:  # the simulator answered with a Java exception: its error, not a dead JVM
            raise
        except Py4JError as err:
            # py4j reports a broken connection as a plain Py4JError too, sometimes before the JVM's last threads
            # have exited (so poll() may still say it runs): the JVM is killed to be sure
            kind = "timeout" if fired.is_set() else "crash"
            self.kill()
            raise SimulatorFailure(kind, self._why(kind, timeout_s, err)) from err
        finally:
            timer.cancel()

    def _why(self, kind: str, timeout_s: float, err: BaseException) -> str:
        if kind == "timeout":
            return f"no answer from the ScienceWorld JVM within {timeout_s:g}s (killed)"
        return f"the ScienceWorld JVM died or its connection broke (exit code {self.process.poll()}): " \
               f"{type(err).__name__}"

    def rss_mb(self) -> float:
        """The JVM's resident memory now (Linux /proc), in MiB; 0 where it cannot be read."""
        return self._status_mb("VmRSS:")

    def peak_rss_mb(self) -> float:
        """The JVM's peak resident memory so far (VmHWM), in MiB; 0 where it cannot be read."""
        return self._status_mb("VmHWM:")

    def _status_mb(self, field: str) -> float:
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith(field):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    def kill(self) -> None:
        """SIGKILL the JVM and drop the connection; safe to call twice, from any thread."""
        process = getattr(self, "process", None)
        if process is not None and process.poll() is None:
            try:
                process.kill()
            except OSError:
                pass
        gateway = getattr(self, "_gateway", None)
        if gateway is not None:
            try:
                gateway.close()
            except Exception:  # a connection to a dead JVM may fail to close; it is gone either way
                pass
        if process is not None:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            for stream in (process.stdin,):
                try:
                    stream.close()
                except OSError:
                    pass
        self._stderr.close()


def machine_memory_mb() -> float:
    """This machine's memory in MiB, or its cgroup's limit when that is lower (a container)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            total = min(total, int(limit) / 2**20)
    except OSError:
        pass
    return total


def slot_cap(heap_mb: int = HEAP_MB, memory_mb: float | None = None) -> int:
    """The most simulators (one JVM per environment slot) that fit MEMORY_SHARE of the machine's memory, each
    budgeted at its heap plus JVM_OVERHEAD_MB."""
    memory_mb = machine_memory_mb() if memory_mb is None else memory_mb
    return max(1, int(MEMORY_SHARE * memory_mb // (heap_mb + JVM_OVERHEAD_MB)))


_IDLE: list[Simulator] = []
_IDLE_LOCK = threading.Lock()


def _take_simulator(heap_mb: int, start_timeout_s: float) -> Simulator:
    with _IDLE_LOCK:
        while _IDLE:
            sim = _IDLE.pop()
            if sim.alive() and sim.heap_mb == heap_mb:
                return sim
            sim.kill()
    return Simulator(heap_mb, start_timeout_s)


def _give_back(sim: Simulator) -> None:
    with _IDLE_LOCK:
        if sim.alive() and len(_IDLE) < MAX_IDLE:
            _IDLE.append(sim)
            return
    sim.kill()


@atexit.register
def close_idle() -> None:
    """Kill the JVMs kept idle by this process (at exit, and for tests that count processes)."""
    with _IDLE_LOCK:
        while _IDLE:
            _IDLE.pop().kill()


# ------------------------------------------------------------------------------------------ gold sequences


def gold_key(spec: Variation) -> str:
    return f"{spec.task}/{spec.variation}/{spec.simplifications}"


def gold_sequences(specs: Sequence[Variation], cache: str | os.PathLike | None = None, *, heap_mb: int = HEAP_MB,
                   timeout_s: float = 120.0) -> dict[Variation, list[str]]:
    """The simulator's gold action sequence of each variation (a load with the gold path each, ~0.3-1 s), read from
    and added to the JSON `cache` when one is given ({"task/variation/simplifications": [action, ...]})."""
    path = Path(cache) if cache is not None else None
    known: dict[str, list[str]] = {}
    if path is not None and path.is_file():
        known = json.loads(path.read_text(encoding="utf-8"))
    missing = [spec for spec in dict.fromkeys(specs) if gold_key(spec) not in known]
    if missing:
        sim = _take_simulator(heap_mb, timeout_s)
        try:
            for spec in missing:
                task = resolve_task(spec.task)
                simplifications = simplifications_for(task, spec.simplifications)
                sim.loaded = None
                sim.call(lambda s, t=task, v=spec.variation, x=simplifications: s.load(t, v, x, True), timeout_s)
                known[gold_key(spec)] = [str(a) for a in sim.call(lambda s: list(s.getGoldActionSequence()),
                                                                  timeout_s)]
        finally:
            _give_back(sim)
        if path is not None:
            if path.is_file():  # another process may have added its own since: keep them
                known = {**json.loads(path.read_text(encoding="utf-8")), **known}
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known, indent=0, sort_keys=True) + "\n", encoding="utf-8")
            os.replace(tmp, path)
    return {spec: list(known[gold_key(spec)]) for spec in specs}


# ------------------------------------------------------------------------------------------ the prompt

SYSTEM_PROMPT = ("You are an agent in ScienceWorld, a text world of elementary science tasks. Complete the task with "
                 "as few actions as possible.")
# The valid action-object combinations run to hundreds or a thousand a step (docs/environments.md): the prompt names
# the simulator's action templates instead, and the agent fills in the objects it reads in the observation.
# The analyzer's prompt names the same templates (skills/prompts.py).
ACTION_TEMPLATES = (
    "look around, look at OBJ, look in OBJ, inventory, go to LOC, teleport to LOC, open OBJ, close OBJ, "
    "pick up OBJ, put down OBJ, move OBJ to OBJ, pour OBJ in OBJ, dunk OBJ in OBJ, mix OBJ, read OBJ, "
    "activate OBJ, deactivate OBJ, use OBJ on OBJ, eat OBJ, flush OBJ, wait, wait1, and focus on OBJ, which "
    "names the task's answer: focusing on a wrong object fails the task.")
INSTRUCTIONS = ("Now it's your turn. Think briefly inside <think></think>, then give exactly one action inside "
                f"<action></action>. Actions: {ACTION_TEMPLATES}\n")


# ------------------------------------------------------------------------------------------ the environment


def truncate(text: str, max_chars: int) -> str:
    """`text`, or its head and a line saying how many characters were cut, within `max_chars` characters."""
    if len(text) <= max_chars:
        return text
    keep = max(0, max_chars - len(_CUT.format(n=len(text))))
    return text[:keep] + _CUT.format(n=len(text) - keep)


def _clean(text: str) -> str:
    return re.sub(r"\n{3,}", "\n\n", str(text).replace("\t", "  ")).strip()


class ScienceWorldEnv:
    """`reset()` / `step(action)` over one ScienceWorld variation (module docstring).

    `step_limit`: steps after which the episode ends (`info["truncated"]`); `gold`: load with the simulator's gold
    action sequence, which `walkthrough` then gives (slower loads: SFT and oracle skills only)."""

    def __init__(self, spec: Variation, *, step_limit: int = 100, heap_mb: int = HEAP_MB,
                 call_timeout_s: float = 10.0, load_timeout_s: float = 90.0, max_chars: int = MAX_TEXT_CHARS,
                 gold: bool = False) -> None:
        if not isinstance(spec, Variation):
            raise TypeError(f"spec must be a Variation, got {type(spec).__name__}")
        task = resolve_task(spec.task)
        self.spec = Variation(task, int(spec.variation), check_simplifications(spec.simplifications, task))
        n = sum(len(v) for v in split_table()[task].values())
        if not 0 <= self.spec.variation < n:
            raise ValueError(f"variation {spec.variation} of {task!r} is not in [0, {n})")
        if isinstance(step_limit, bool) or not isinstance(step_limit, int) or step_limit < 1:
            raise ValueError(f"step_limit must be an int >= 1, got {step_limit!r}")
        self.game_id = str(self.spec)
        self.step_limit, self.heap_mb, self.max_chars, self.gold = step_limit, int(heap_mb), int(max_chars), gold
        self.call_timeout_s, self.load_timeout_s = float(call_timeout_s), float(load_timeout_s)
        self._sim: Simulator | None = None
        self._task = ""
        self._admissible: list[str] = []
        self._steps = 0
        self._score = 0
        self._done = True
        self._started = False
        self.walkthrough: list[str] | None = None
        self.failures = {"timeout": 0, "crash": 0}
        self.n_starts = 0

    def reset(self) -> Observation:
        """A fresh episode; starts (or restarts after a failure) the JVM and loads the variation when needed.
        A failure here raises SimulatorFailure (the slots report a failed reset)."""
        try:
            return self._reset()
        except SimulatorFailure as err:
            self.failures[err.kind] += 1
            self._discard()
            raise

    def _reset(self) -> Observation:
        started = time.monotonic()
        if self._sim is None or not self._sim.alive():
            self._discard()
            self._sim = _take_simulator(self.heap_mb, self.load_timeout_s)
            self.n_starts += 1
        sim, spec = self._sim, self.spec
        key = (spec.task, spec.variation, spec.simplifications, self.gold)
        left = max(1.0, self.load_timeout_s - (time.monotonic() - started))
        simplifications = simplifications_for(spec.task, spec.simplifications)
        if sim.loaded != key:
            sim.loaded = None
            sim.call(lambda s: s.load(spec.task, spec.variation, simplifications, self.gold), left)
            sim.loaded = key
            if self.gold:
                self.walkthrough = [str(a) for a in sim.call(lambda s: s.getGoldActionSequence(), left)]

        def first(s: Any) -> tuple[str, str, str, str, list[str]]:
            s.reset()
            feedback = s.step("look around")
            return feedback, s.freeActionTaskDesc(), s.freeActionLook(), s.freeActionInventory(), \
                list(s.getValidActionObjectCombinations())

        feedback, task, look, inventory, valid = sim.call(first, left)
        self._task = _clean(re.sub(r"^\s*Task Description:\s*", "", str(task)))
        self._steps, self._score, self._done, self._started = 0, 0, False, True
        return self._observe(feedback, look, inventory, valid)

    def step(self, action: str) -> tuple[Observation, float, bool, dict[str, Any]]:
        check_step(self.game_id, action, started=self._started, done=self._done)
        listed = {normalize_action(a): a for a in self._admissible}
        command = listed.get(normalize_action(action), " ".join(action.split()))
        if normalize_action(action) in HIDDEN_ACTIONS:
            return Observation(REFUSED_TEXT, self._task, list(self._admissible)), 0.0, False, \
                {"won": False, "lost": False, "valid": False, "score": self._score, "truncated": False}
        self._steps += 1
        sim = self._sim
        assert sim is not None

        def one_step(s: Any) -> tuple[str, float, bool, int, str, str, list[str]]:
            feedback = s.step(command)
            return feedback, float(s.getScore()), bool(s.getCompleted()), int(s.getNumMoves()), \
                s.freeActionLook(), s.freeActionInventory(), list(s.getValidActionObjectCombinations())

        try:
            feedback, score01, completed, moves, look, inventory, valid = sim.call(one_step, self.call_timeout_s)
        except SimulatorFailure as err:
            self.failures[err.kind] += 1
            self._discard()
            self._done = True
            info = {"won": False, "lost": False, "valid": normalize_action(action) in listed, "score": 0,
                    "error": str(err), "failure": err.kind, **self.counters()}
            return Observation("", self._task, []), 0.0, True, info
        score = self._score = int(round(100 * score01))
        won, lost = completed and score >= 100, score < 0
        truncated = not (won or lost or completed) and self._steps >= self.step_limit
        self._done = won or lost or completed or truncated
        valid_action = normalize_action(action) in listed or UNKNOWN_ACTION not in str(feedback)
        info = {"won": won, "lost": lost, "valid": valid_action, "score": score, "moves": moves,
                "truncated": truncated}
        return self._observe(feedback, look, inventory, valid), 1.0 if won else 0.0, self._done, info

    def counters(self) -> dict[str, int]:
        """Cumulative: simulator calls that timed out, JVMs that crashed, JVMs started."""
        return {"simulator_timeouts": self.failures["timeout"], "simulator_crashes": self.failures["crash"],
                "simulator_starts": self.n_starts}

    @property
    def pid(self) -> int | None:
        """The JVM's process id (None before the first reset or after a failure)."""
        return self._sim.pid if self._sim is not None else None

    @property
    def simulator(self) -> Simulator | None:
        return self._sim

    def close(self) -> None:
        if self._sim is not None:
            _give_back(self._sim)
            self._sim = None
        self._done = True

    def _discard(self) -> None:
        if self._sim is not None:
            self._sim.kill()
            self._sim = None

    def _observe(self, feedback: str, look: str, inventory: str, valid: list[str]) -> Observation:
        parts = [_clean(feedback)]
        if _clean(look) != parts[0]:
            parts.append(_clean(look))
        parts.append(_clean(inventory))
        text = truncate("\n\n".join(p for p in parts if p), self.max_chars)
        seen: dict[str, str] = {}
        for a in valid:
            a = " ".join(str(a).split())
            if normalize_action(a) not in HIDDEN_ACTIONS:
                seen.setdefault(normalize_action(a), a)
        self._admissible = [seen[k] for k in sorted(seen)]
        return Observation(text=text, task=self._task, admissible_actions=list(self._admissible))


@dataclass(frozen=True)
class ScienceWorldFactory:
    """Builds a ScienceWorldEnv for a Variation with the run's settings; a plain dataclass, so worker processes
    (envs/workers.py) unpickle it."""

    step_limit: int = 100
    heap_mb: int = HEAP_MB
    call_timeout_s: float = 10.0
    load_timeout_s: float = 90.0
    max_chars: int = MAX_TEXT_CHARS
    gold: bool = False

    def __call__(self, spec: Variation) -> ScienceWorldEnv:
        return ScienceWorldEnv(spec, step_limit=self.step_limit, heap_mb=self.heap_mb,
                               call_timeout_s=self.call_timeout_s, load_timeout_s=self.load_timeout_s,
                               max_chars=self.max_chars, gold=self.gold)
