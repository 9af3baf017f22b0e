"""The rollout producer of asynchronous RL (docs/architecture.md, 'Asynchronous rollouts'): a process of its own
with its own rollout engine (rollout.engine: the own engine over a copy of the policy, or a vLLM engine;
`producer_engine`) and its own environment slots, rolling out update s on policy version
`staleness.rollout_version(s)` while the trainer learns from earlier batches.

    producer = RolloutProducer(cfg, policy_dir, first_step=0, first_version=0, device=device)
    producer.push(policy, version=0)        # a version, in buckets over the weight group (distributed/weight_channel)
    for step in ...:
        produced = producer.next(step)      # blocks until update `step`'s batch is there (or the producer died)
        ... learn ...
        producer.push(policy, version=step + 1)
    producer.close()

Every episode finishes on the weights it started with: a batch is one version (no partial rollouts), so each token's
version is its trajectory's (`Trajectory.meta["policy_version"]`). The producer dies with the trainer whatever ends
it (envs/lifeline.py: PR_SET_PDEATHSIG and a lifeline pipe; its environment workers die with it in turn), and the
trainer gets one `RolloutProducerError` naming the producer's exit (`ProducerExit`), or carrying its traceback, when
the producer fails, and one naming the update it waited for when the producer sends nothing for
`rollout.producer_timeout_s`. The producer is known dead only from its results pipe's end (every message before it
has been read), never from the process alone. A push ends when the producer's receiver says on a pipe of its own that
it holds the version whole (`RolloutProducer.received`), not when the broadcasts return: on NCCL they return before
the weights land and never raise on a dead peer. Whichever call finds the producer gone raises the failure it sent,
with its traceback (`Inbox.died`).
"""

from __future__ import annotations

import ctypes
import enum
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import get_context, util
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch

from seedfast.config import Config
from seedfast.distributed.weight_channel import (
    STOP,
    Layout,
    WeightChannel,
    bucket_layout,
    fingerprint,
    load_buckets,
    loaded_fingerprint,
    named_buckets,
    named_layout,
)
from seedfast.distributed.weight_push import adapter_named_tensors, hf_named_tensors
from seedfast.model.lora import adapter_fingerprint
from seedfast.runtime.placement import producer_device, producer_environment
from seedfast.runtime.precision import DTYPES
from seedfast.train.staleness import VERSION_KEY, Produced, check_weights, rollout_version

POLL_S = 0.2
# after the process ended, how long its results pipe may stay open (the reader still reading its last messages)
# before the producer is called dead without the pipe's end
READER_GRACE_S = 30.0


class ProducerExit(enum.IntEnum):
    """The producer process's exit codes (the one place they are defined). 1 stays Python's own: an error before the
    producer's handler ran (its import, its start)."""

    DONE = 0  # every update it was asked for rolled out and sent
    FAILED = 3  # an exception: its traceback went to the trainer first
    TRAINER_GONE = 4  # its lifeline closed: the trainer died, or ended it (RolloutProducer.close)


# how long the trainer waits for a producer whose weight group failed to show as dead before calling it a timeout
_DEATH_GRACE_S = 5.0


def describe_exit(code: int | None) -> str:
    """A producer's exit code in words."""
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by signal {-code}"
    try:
        return f"exit code {code}, {ProducerExit(code).name.lower().replace('_', ' ')}"
    except ValueError:
        return f"exit code {code}"


class RolloutProducerError(RuntimeError):
    """The rollout producer died, failed or went silent: the run cannot go on. A failure's traceback (the
    producer's, or the trainer's reader thread's) is `trace`, and the cause this error is raised from, so that the run's
    errors.log holds it while the run's one line stays one line."""

    def __init__(self, message: str, trace: str | None = None) -> None:
        super().__init__(message)
        self.trace = trace

    def resumable(self, point: str) -> RolloutProducerError:
        """This error with where a `--resume auto` starts (runtime/checkpoint.py) added to its line."""
        return type(self)(f"{self}; {point}", self.trace)


class RolloutProducerTimeout(RolloutProducerError):
    """The producer sent nothing for rollout.producer_timeout_s."""


class WeightSyncError(RolloutProducerError):
    """The producer rolled out with weights other than the version the trainer sent (their fingerprints differ): a
    push that did not land (verl #7495: an asynchronous LoRA run that silently trained on the first policy). Never
    trained on."""


def resume_point(ckpt_dir: Path) -> str:
    """Where a `--resume auto` of the run whose checkpoints are in `ckpt_dir` continues."""
    from seedfast.runtime.checkpoint import list_checkpoints

    ckpts = list_checkpoints(ckpt_dir)
    if not ckpts:
        return "no checkpoint yet: a rerun starts at update 0"
    step = ckpts[-1].name.removeprefix("step_")
    return f"--resume auto continues at update {step} from {ckpts[-1]}"


class _RemoteTraceback(Exception):
    """A traceback from another thread or process, as text (raised from, so that it prints with the error)."""

    def __str__(self) -> str:
        return str(self.args[0])


def _error(message: str, trace: str) -> RolloutProducerError:
    err = RolloutProducerError(message, trace)
    err.__cause__ = _RemoteTraceback(trace)
    return err


@dataclass
class _Failure:
    step: int
    error: str
    trace: str


@dataclass
class _Ready:
    pid: int


@dataclass
class _ReaderFailed:
    """The trainer's reader thread could not take a message in (its traceback)."""

    error: str
    trace: str


_EOF = None  # the results pipe ended: every message the producer sent was read before it


class Inbox:
    """The producer's messages, taken in by a reader thread as they come (the producer never blocks on a full pipe).

    The producer is dead when its pipe ends (the reader's EOF, after every message it sent), or when the process has
    ended and the reader has not finished within READER_GRACE_S; never merely because the process ended while the
    reader still unpickles its last message. Any other failure of the reader reaches `get` with its traceback."""

    def __init__(self, process: Any, conn: Connection, timeout_s: float | None,
                 decode: Callable[[bytes], Any] = pickle.loads) -> None:
        self.process = process
        self.timeout_s = timeout_s
        self._conn = conn
        self._decode = decode
        self._queue: queue.Queue[Any] = queue.Queue()
        self._ended = False
        self._failure: _Failure | None = None  # the producer's failure, once read
        self.reader = threading.Thread(target=self._read, name="rollout-producer-reader", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = self._conn.recv_bytes()
            except (EOFError, OSError):
                self._queue.put(_EOF)
                return
            try:
                msg = self._decode(data)
            except BaseException as err:  # noqa: BLE001 - handed to the trainer's thread, which raises it
                self._queue.put(_ReaderFailed(repr(err), traceback.format_exc()))
                return
            self._queue.put(msg)

    def exitcode(self) -> int | None:
        return self.process.exitcode

    def died(self, doing: str, cause: BaseException | None = None) -> RolloutProducerError:
        """The error for a producer found gone while the trainer was `doing` something: its own failure with its
        traceback as the cause when it sent one (whichever call finds it gone: a push reads no messages, and the
        failure may sit behind batches not yet read), else its exit, caused by `cause` (a broadcast's error). Raised
        `from` its own cause: `from err` would replace the producer's traceback with the trainer's side of it."""
        self.process.join(timeout=5)
        failure = self._failure_sent()
        if failure is not None:
            err = _error(f"the rollout producer failed at update {failure.step}: {failure.error} (found when the "
                         f"trainer {doing})", failure.trace)
        else:
            err = RolloutProducerError(f"the rollout producer (pid {self.process.pid}) ended "
                                       f"({describe_exit(self.process.exitcode)}) while the trainer {doing}")
            err.__cause__ = cause
        err.__suppress_context__ = True
        return err

    def _failure_sent(self) -> _Failure | None:
        """The failure the ended producer sent, if any: the reader is given until the pipe's end (READER_GRACE_S)
        to take in what is left, and the messages before the failure are dropped (the run cannot go on)."""
        if self._failure is None and not self.process.is_alive():
            self.reader.join(timeout=READER_GRACE_S)
            while True:
                try:
                    msg = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(msg, _Failure):
                    self._failure = msg
                if msg is _EOF or isinstance(msg, (_Failure, _ReaderFailed)):
                    self._ended = True
        return self._failure

    def get(self, doing: str, *, wait_s: float | None = None, since: float | None = None) -> Any:
        """The next message; raises RolloutProducerError when the producer ended, failed or sent nothing for
        `timeout_s` (None: waits as long as it takes) since `since` (time.monotonic(); default: now). With `wait_s`,
        None when nothing came within it (a slice of a longer wait: async_ranks.wait_together)."""
        if self._ended:
            raise self.died(doing)
        called = time.monotonic()
        start = called if since is None else since
        dead_since: float | None = None
        while True:
            try:
                msg = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                now = time.monotonic()
                if self.timeout_s is not None and now - start > self.timeout_s:
                    raise RolloutProducerTimeout(
                        f"the rollout producer (pid {self.process.pid}, {describe_exit(self.process.exitcode)}) "
                        f"sent nothing for {self.timeout_s:g} s (rollout.producer_timeout_s) while the trainer "
                        f"{doing}") from None
                if not self.process.is_alive():  # its pipe's end is what counts; this is the fallback
                    dead_since = now if dead_since is None else dead_since
                    if now - dead_since > READER_GRACE_S:
                        self._ended = True
                        err = self.died(f"{doing} (its results pipe never ended)")
                        raise err from err.__cause__
                if wait_s is not None and now - called > wait_s:
                    return None
                continue
            if msg is _EOF:
                self._ended = True
                raise self.died(doing)
            if isinstance(msg, _ReaderFailed):
                self._ended = True
                raise _error(f"the trainer's reader of the rollout producer failed ({msg.error}) while the trainer "
                             f"{doing}", msg.trace)
            if isinstance(msg, _Failure):
                self._ended, self._failure = True, msg
                raise _error(f"the rollout producer failed at update {msg.step}: {msg.error}", msg.trace)
            return msg

    def close(self, timeout: float = 10.0) -> None:
        """After the process ended: the reader gets the pipe's end and stops; then the pipe closes."""
        self.reader.join(timeout=timeout)
        self._conn.close()


def split_threads(total: int, trainer_ranks: int = 1) -> tuple[int, int]:
    """(each trainer rank's, the producer's) intra-op threads on the node whose `trainer_ranks` ranks each started
    with `total` threads (torch.get_num_threads(): the cores, or OMP_NUM_THREADS) and share its cores with the
    producer: the ranks' threads together, split evenly over the ranks and the producer, at least one each, the
    one process's remainder its own. Oversubscribed, the trainer's float results varied from run to run at ~1e-6
    (docs/architecture.md, 'Asynchronous rollouts': repeatable); and a rank with fewer threads than the others (rank
    0 halving its own alone) would hold every collective of the update back."""
    cores = total * trainer_ranks
    producer = max(1, cores // (trainer_ranks + 1))
    return max(1, (cores - producer) // trainer_ranks), producer


def ranks_beside_producer(environ: dict[str, str], world: int) -> int:
    """The trainer ranks on the producer's node (global rank 0's): torchrun's LOCAL_WORLD_SIZE there, every rank of
    a group started without torchrun (one node), 0 on another node."""
    if int(environ.get("GROUP_RANK", "0")) != 0:
        return 0
    return int(environ.get("LOCAL_WORLD_SIZE", world))


class RolloutProducer:
    """The trainer's handle on the producer process (the module docstring)."""

    def __init__(self, cfg: Config, policy_dir: str | Path, *, first_step: int, first_version: int,
                 device: torch.device, threads: int | None = None) -> None:
        self.cfg = cfg
        self.dtype = channel_dtype(cfg)
        self.bucket_bytes = cfg.rollout.sync_bucket_mb << 20
        timeout = cfg.rollout.producer_timeout_s
        self.channel = WeightChannel.listen(device, timeout_s=timeout)
        ctx = get_context("spawn")  # the producer's parent is the trainer: PR_SET_PDEATHSIG reaches it
        lifeline_r, self._lifeline_w = ctx.Pipe(duplex=False)  # only the trainer holds the write end
        self._results_r, results_w = ctx.Pipe(duplex=False)
        # the producer's word that it holds a version whole: the push's liveness, on a pipe (a pipe cannot block
        # behind a GPU collective, and a dead producer shows as its end)
        self._acks_r, acks_w = ctx.Pipe(duplex=False)
        # not a daemon (its environment workers are its children); ended before multiprocessing joins children
        # at exit by the finalizer below, and by the kernel or its lifeline if this process dies otherwise
        self.process = ctx.Process(
            target=produce, name="seedfast-rollout-producer",
            args=(cfg, str(policy_dir), self.channel.port, first_step, first_version, results_w, lifeline_r,
                  threads or torch.get_num_threads(), acks_w))
        with producer_environment(cfg):  # rollout.devices: the producer sees only its GPUs; it is no torchrun rank
            self.process.start()
        results_w.close()
        lifeline_r.close()
        acks_w.close()
        self.inbox = Inbox(self.process, self._results_r, timeout)
        self._ready = False
        self.sent: dict[int, int] = {}  # version -> fingerprint of the weights sent as it
        self._pushed: dict[int, float] = {}  # version -> when its push began (time.monotonic())
        self._acked: set[int] = set()  # versions the producer said it holds
        self.adapters = sends_adapters(cfg)  # LoRA with rollout.lora_sync=adapter: the adapters alone travel
        self.checked: int | None = None  # the fingerprint the producer reported for the last batch, checked
        self._exit: list[int | None] = [None]  # the exit code, kept when close() releases the process
        self._finalizer = util.Finalize(self, _end, exitpriority=10,
                                        args=(self.process, self._lifeline_w, self.inbox, self.channel, self._exit,
                                              self._acks_r))

    @property
    def exitcode(self) -> int | None:
        """The producer's exit code (ProducerExit, or -signal), None while it runs."""
        return self._exit[0] if self._exit[0] is not None else self.inbox.exitcode()

    def ready(self, *, wait_s: float | None = None, since: float | None = None) -> bool | None:
        """Wait for the producer's start (its weight group's side exists once it said so: never wait on a dead
        one); with `wait_s`, None when it has not started within it (Inbox.get)."""
        if not self._ready:
            msg = self.inbox.get("waited for it to start", wait_s=wait_s, since=since)
            if msg is None:
                return None
            if not isinstance(msg, _Ready):
                raise RolloutProducerError(f"the rollout producer sent {type(msg).__name__} where its start was due")
            self._ready = True
        return True

    def _started(self) -> None:
        self.ready()

    def push(self, policy: torch.nn.Module, version: int, *, wait: bool = True) -> dict[str, float]:
        """Send `policy`'s weights as `version` (a collective with the producer's receiver thread) and wait for the
        producer's word that it holds them (`received`); `wait=False` leaves that wait to the caller (under torchrun,
        in heartbeats: train/rl.py Trainer._push)."""
        start = time.perf_counter()
        self._started()
        if not self.process.is_alive():
            raise self.inbox.died(f"sent it policy version {version}")
        named, sent_print = sent_weights(self.cfg, policy), None
        if self.adapters:  # the adapters alone, hashed as sent: what the producer's copy must hold bit for bit
            sent_print = adapter_print(named)
        since = time.monotonic()
        try:
            stats = self.channel.send(version, named, self.bucket_bytes)
        except RuntimeError as err:  # gloo: the peer closed the group mid-broadcast, or the group's timeout passed
            doing = f"sent it policy version {version} ({' '.join(str(err).split())[:300]})"
            # a killed peer's sockets close before the kernel reaps it: give its death a moment to show before
            # calling it a timeout
            self.process.join(timeout=_DEATH_GRACE_S)
            self.channel.abort()
            if self.process.is_alive():
                raise self._no_weights(doing, version) from err
            gone = self.inbox.died(doing, cause=err)
            raise gone from gone.__cause__
        self._pushed[version] = since
        if wait:
            self.received(version)
        self.sent[version] = int(stats["fingerprint"]) if sent_print is None else sent_print
        metrics = {"async/push_seconds": time.perf_counter() - start, "async/push_bytes": stats["bytes"],
                   "async/push_fingerprint": short_print(self.sent[version])}
        if self.checked is not None:  # the weights the batch just learned from were rolled out with, as loaded
            metrics["async/rollout_fingerprint"] = short_print(self.checked)
        return metrics

    def _no_weights(self, doing: str, version: int) -> RolloutProducerTimeout:
        return RolloutProducerTimeout(
            f"the rollout producer (pid {self.process.pid}) took no weights for "
            f"{self.cfg.rollout.producer_timeout_s:g} s (rollout.producer_timeout_s) while the trainer {doing}, "
            f"after update {version - 1}")

    def received(self, version: int, wait_s: float | None = None, since: float | None = None) -> bool | None:
        """Wait until the producer says it holds `version` whole (its receiver's ack on the acks pipe): True, or None
        when it has not within `wait_s` (a slice of a longer wait: async_ranks.wait_together, whose `since` is not
        used: rollout.producer_timeout_s counts from the push's start). The push's own bound on every backend:
        gloo's broadcast may return once the bytes are in the socket's buffers, and NCCL's returns before they
        land and never raises on a dead peer, its watchdog aborting the job instead (distributed/weight_channel.py
        for why the sender never waits on NCCL). A timeout or a death aborts the weight group, so no broadcast
        stays in flight, and raises one RolloutProducerError."""
        timeout = self.cfg.rollout.producer_timeout_s
        doing = f"sent it policy version {version}"
        if version in self._acked:
            return True
        called, pushed = time.monotonic(), self._pushed[version]
        while True:
            if self._acks_r.poll(POLL_S):
                try:
                    got = pickle.loads(self._acks_r.recv_bytes())
                except (EOFError, OSError):  # the pipe's end: the producer is gone
                    self.channel.abort()
                    gone = self.inbox.died(doing)
                    raise gone from gone.__cause__
                self._acked.add(got)
                if got == version:
                    self.channel.sent()
                    return True
                continue
            if not self.process.is_alive():
                self.channel.abort()
                raise self.inbox.died(doing)
            now = time.monotonic()
            if timeout is not None and now - pushed > timeout:
                self.channel.abort()
                raise self._no_weights(doing, version)
            if wait_s is not None and now - called > wait_s:
                return None

    def next(self, step: int, *, wait_s: float | None = None, since: float | None = None) -> Produced | None:
        """Update `step`'s batch (the producer sends them in order); with `wait_s`, None when it has not come within
        it (rollout.producer_timeout_s still counts from `since`: Inbox.get)."""
        self._started()
        msg = self.inbox.get(f"waited for the rollout of update {step}", wait_s=wait_s, since=since)
        if msg is None:
            return None
        if not isinstance(msg, Produced):
            raise RolloutProducerError(f"the rollout producer sent {type(msg).__name__} where update {step}'s "
                                       "rollout was due")
        self._check_weights(msg)
        return msg

    def _check_weights(self, produced: Produced) -> None:
        """The producer's engine held the very weights the trainer sent as the batch's version (staleness.check_weights:
        the fingerprint it read back after loading them), checked on the first batch of every version pushed; a
        mismatch is one WeightSyncError naming the update and the version, before anything is learned from it."""
        want = self.sent.get(produced.version)
        if want is not None and produced.fingerprint != want:
            what = f"LoRA adapters (rollout.lora_sync={self.cfg.rollout.lora_sync})" if self.adapters else "weights"
            got = "none" if produced.fingerprint is None else f"{produced.fingerprint % 2**64:016x}"
            raise WeightSyncError(
                f"update {produced.step}: the rollout producer rolled out with {what} that are not policy version "
                f"{produced.version} as the trainer sent them (fingerprint {got} loaded, {want % 2**64:016x} sent): "
                "the push did not land in its engine; the run stops rather than learn from another policy's rollouts")
        check_weights(produced, self.sent)
        self.checked = produced.fingerprint

    def close(self) -> None:
        """End the producer now, whatever it is doing (its lifeline closes; its environment workers follow), then
        its reader thread, its pipes and the weight group: nothing of it is left in this process."""
        self._finalizer()


def _end(process: Any, lifeline_w: Connection, inbox: Inbox, channel: WeightChannel, exit: list[int | None],
         acks_r: Connection) -> None:
    lifeline_w.close()
    process.join(timeout=10)
    if process.is_alive():
        process.kill()
        process.join()
    exit[0] = process.exitcode
    inbox.close()
    acks_r.close()
    channel.close()
    process.close()  # its sentinel descriptor


# The producer's exit code once its lifeline closes: TRAINER_GONE, unless the producer has already told the trainer
# how it ends (its failure, or its last rollout): the trainer, told, closes the lifeline at once, and the watcher
# thread must not overwrite the code the main thread is about to exit with.
_EXIT_ON_LIFELINE = [ProducerExit.TRAINER_GONE]


def _die_with_trainer(lifeline: Connection) -> None:
    """envs/lifeline.py's die_with_owner, exiting _EXIT_ON_LIFELINE: the kernel's SIGKILL when the trainer (the
    parent: spawn) dies, and a thread that waits for the lifeline's end."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    if lifeline.poll():  # the trainer was gone before the line above: no signal will come
        os._exit(ProducerExit.TRAINER_GONE)

    def watch() -> None:
        wait([lifeline])
        _exit(_EXIT_ON_LIFELINE[0])

    threading.Thread(target=watch, name="trainer-lifeline", daemon=True).start()


class _Staged:
    """Versions the receiver thread got, waiting for the update they roll out."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.versions: dict[int, list[torch.Tensor]] = {}
        self.stopped = False
        self.error: BaseException | None = None

    def receive(self, channel: WeightChannel, layout: Any, dtype: torch.dtype, acks: Connection) -> None:
        try:
            while True:
                version, flats = channel.receive(layout, dtype)
                if version != STOP:  # the trainer's push waits for this word (RolloutProducer.received)
                    if channel.device.type == "cuda":
                        torch.cuda.synchronize(channel.device)  # landed, not merely enqueued
                    acks.send_bytes(pickle.dumps(version))
                with self.cond:
                    if version == STOP:
                        self.stopped = True
                    else:
                        self.versions[version] = flats
                    self.cond.notify_all()
                if version == STOP:
                    return
        except BaseException as err:  # noqa: BLE001 - handed to the main thread, which reports it
            with self.cond:
                self.error = err
                self.cond.notify_all()

    def take(self, version: int) -> list[torch.Tensor]:
        with self.cond:
            self.cond.wait_for(lambda: version in self.versions or self.stopped or self.error is not None)
            if version not in self.versions:
                raise RuntimeError(f"policy version {version} never came"
                                   + (f": {self.error!r}" if self.error else " (the trainer stopped)"))
            for old in [v for v in self.versions if v < version]:
                del self.versions[old]
            return self.versions.pop(version)


def channel_dtype(cfg: Config) -> torch.dtype:
    """The dtype a version travels in: the one the producer's engine computes in (model.dtype for the own engine;
    for vLLM rollout.vllm_dtype when set, what the synchronous loop pushes); LoRA adapters sent alone travel in
    their own dtype (optim.master_dtype), so the engine's adapters are the trainer's bit for bit."""
    from seedfast.runtime.setup import engine_dtype

    if sends_adapters(cfg):
        return DTYPES[cfg.optim.master_dtype]
    return DTYPES[engine_dtype(cfg) if cfg.rollout.engine == "vllm" else cfg.model.dtype]


def sends_adapters(cfg: Config) -> bool:
    """Whether a version is the LoRA adapters alone (model.lora with rollout.lora_sync=adapter, or auto with the own
    engine: rollout/colocated.py resolve_lora_sync), not the weights."""
    from seedfast.rollout.colocated import resolve_lora_sync
    from seedfast.runtime.adapters import uses_lora

    return uses_lora(cfg) and resolve_lora_sync(cfg.rollout.lora_sync, cfg.rollout.engine) == "adapter"


def sent_weights(cfg: Config, policy: torch.nn.Module) -> Any:
    """What a push sends of `policy` as (name, full tensor): its adapters (`sends_adapters`), else its weights in
    HF names (merged with a LoRA policy), in `channel_dtype`. Under torchrun every rank runs it (the gathers of a
    sharded policy: `take_part`)."""
    if sends_adapters(cfg):
        return adapter_named_tensors(policy)
    return hf_named_tensors(policy, dtype=channel_dtype(cfg))


def take_part(cfg: Config, policy: torch.nn.Module) -> None:
    """A trainer rank other than 0 while rank 0 sends a version: the same gathers, in the same order
    (train/async_ranks.py take_part_in_push, for the adapters too)."""
    for _ in sent_weights(cfg, policy):
        pass


def adapter_print(named: Any) -> int:
    """The fingerprint of LoRA adapters as (name, tensor): model/lora.py's adapter_fingerprint (SHA-256 over the
    names, dtypes, shapes and bytes), as an int."""
    return int(adapter_fingerprint(list(named)), 16)


def short_print(value: int) -> float:
    """A fingerprint as a metric: its low 48 bits, exact in a float."""
    return float(value % 2**48)


def trainer_engine(cfg: Config) -> str:
    """The engine the trainer's own process builds: rollout.engine in the synchronous loop. With a producer the
    rollouts are its engine's (`producer_engine`), and what the trainer still generates (SEED's analysis, GRSD's
    reflections) is written by its live policy, as the own engine reads it: a vLLM engine there would never be
    pushed a version, and would hold a second copy of the model on the trainer's device."""
    return cfg.rollout.engine if cfg.rollout.max_staleness == 0 else "own"


class ProducerEngine:
    """The producer's rollout engine (`rollout`: the engine protocol and its per-step hooks, rollout/colocated.py)
    and how a received version enters it: `load(flats)` takes the flat buckets of `layout` and returns the
    fingerprint of the weights the engine then rolls out with, which the trainer compares with the version it sent
    (staleness.check_weights). Built by `producer_engine`, the one place the producer's engine is chosen."""

    rollout: Any
    layout: Layout

    def load(self, flats: list[torch.Tensor]) -> int:
        raise NotImplementedError

    def close(self) -> None:
        self.rollout.close()


class OwnProducerEngine(ProducerEngine):
    """The own engine over the producer's copy of the policy: a version is copied into the copy, and its fingerprint
    is read back from the copy the sampler reads (a copy that loaded nothing keeps the old fingerprint).

    With LoRA adapters sent alone (`sends_adapters`) the copy is the run's adapted model (runtime/adapters.py
    attach_adapters on the producer's own base: the frozen base in model.dtype, the adapters in
    optim.master_dtype, as the trainer's policy) and a version is its adapters, copied into its LoRA layers; the
    fingerprint is `adapter_print` of the adapters the copy then holds."""

    def __init__(self, cfg: Config, policy_dir: Path, device: torch.device) -> None:
        from seedfast.rollout.colocated import OwnRollout
        from seedfast.runtime.adapters import attach_adapters
        from seedfast.runtime.setup import load_policy

        self.model = load_policy(cfg, policy_dir, device, trainable=False)
        self.adapters = sends_adapters(cfg)
        bucket_bytes = cfg.rollout.sync_bucket_mb << 20
        if self.adapters:
            attach_adapters(cfg, self.model, base=None)  # its values are replaced by every version sent
            self.model.requires_grad_(False)
            self.layout = named_layout(adapter_named_tensors(self.model), bucket_bytes)
        else:
            self.layout = bucket_layout(self.model, bucket_bytes, dtype=channel_dtype(cfg))
        self.rollout = OwnRollout(self.model, seed=cfg.run.seed)

    def load(self, flats: list[torch.Tensor]) -> int:
        load_buckets(self.model, self.layout, flats)
        if self.adapters:
            state = self.model.state_dict(keep_vars=True)
            return adapter_print((slot.name, state[slot.name]) for bucket in self.layout for slot in bucket)
        return loaded_fingerprint(self.model, self.layout)


class VLLMProducerEngine(ProducerEngine):
    """A vLLM engine built as the synchronous loop builds its own (rollout/colocated.py `build_rollout`, the
    rollout.* options, awake throughout: nothing else needs its memory), running inside the producer's process
    (VLLM_ENABLE_V1_MULTIPROCESSING=0), so that it dies with the producer: vLLM 0.32's engine-core process has no
    watch on its parent (only its workers have a death pipe), and a producer killed with SIGKILL would leave it.

    A version is pushed as received (`VLLMEngine.push_weights`: the buckets under their HF names, the CPU back
    end's layerwise reload, the prefix cache reset), and vLLM's own verify (`VLLMEngine._verify`: checksums of the
    tensors it keeps unfused, probes of what its CPU kernels compute with) raises when the push did not land. The
    fingerprint reported is that of the received flat buckets that were pushed, not one read back from vLLM: vLLM
    repacks its copy (q/k/v and gate/up fused, the CPU kernels' packed layouts), so the sent tensors cannot be found
    in it bit for bit. The fingerprint shows that the version crossed the channel intact, the verify that vLLM
    computes with it.

    With LoRA adapters sent alone (`sends_adapters`) the engine serves them over the base it loaded from the policy
    folder (vLLM's LoRA support: VLLMRollout.load_adapters, which hashes what vLLM's LoRA layers then hold against
    the adapters received and raises when they differ); the fingerprint reported is `adapter_print` of the adapters
    received, the trainer's as sent."""

    def __init__(self, cfg: Config, policy_dir: Path) -> None:
        from seedfast.model import Decoder, hf_config
        from seedfast.model.lora import add_lora
        from seedfast.rollout.colocated import build_rollout
        from seedfast.runtime.adapters import lora_spec
        from seedfast.runtime.setup import engine_dtype, vllm_options

        with torch.device("meta"):  # the layout needs names and shapes only: no second copy of the weights
            structure = Decoder(hf_config(policy_dir))
        bucket_bytes = cfg.rollout.sync_bucket_mb << 20
        self.adapters = sends_adapters(cfg)
        if self.adapters:  # the adapters' names and shapes, on the meta structure
            add_lora(structure, lora_spec(cfg), dtype=channel_dtype(cfg))
            self.layout = named_layout(adapter_named_tensors(structure), bucket_bytes)
        else:
            self.layout = bucket_layout(structure, bucket_bytes, dtype=channel_dtype(cfg))
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self.rollout = build_rollout("vllm", structure, policy_dir, seed=cfg.run.seed, dtype=engine_dtype(cfg),
                                     sleep=False, lora_sync=cfg.rollout.lora_sync, **vllm_options(cfg))

    def load(self, flats: list[torch.Tensor]) -> int:
        if self.adapters:
            adapters = [item for bucket in named_buckets(self.layout, flats) for item in bucket]
            self.rollout.load_adapters(adapters)  # raises when vLLM's LoRA layers do not hold them
            return adapter_print(adapters)
        self.rollout.before_rollout(named_buckets(self.layout, flats))  # raises when the push did not land
        return fingerprint(flats)


def producer_engine(cfg: Config, policy_dir: Path, device: torch.device) -> ProducerEngine:
    """The producer's rollout engine, rollout.engine's kind."""
    if cfg.rollout.engine == "vllm":
        return VLLMProducerEngine(cfg, policy_dir)
    return OwnProducerEngine(cfg, policy_dir, device)


def produce(cfg: Config, policy_dir: str, port: int, first_step: int, first_version: int, results: Connection,
            lifeline: Connection, threads: int, acks: Connection) -> None:
    """The producer process: rollouts of updates first_step.. in order, each on its version, sent to the trainer."""
    _die_with_trainer(lifeline)
    torch.set_num_threads(threads)
    step = first_step
    try:
        for produced in _produce(cfg, Path(policy_dir), port, first_step, first_version, results, acks):
            results.send_bytes(pickle.dumps(produced))
            step = produced.step + 1
    except BaseException as err:  # noqa: BLE001 - every failure reaches the trainer as one error
        _EXIT_ON_LIFELINE[0] = ProducerExit.FAILED
        try:
            results.send_bytes(pickle.dumps(_Failure(step, repr(err), traceback.format_exc())))
            results.close()
        except OSError:  # the trainer is gone: nobody to tell
            pass
        _exit(ProducerExit.FAILED)
    _EXIT_ON_LIFELINE[0] = ProducerExit.DONE
    results.close()
    _exit(ProducerExit.DONE)  # the receiver thread may still sit in the group's broadcast: no teardown around it


def _exit(code: int) -> None:
    """os._exit, after the exit-time finalizers a normal exit runs first (multiprocessing's, priority >= 0): the
    named semaphores of locks made in this process (vLLM's executor lock, tqdm's write lock) are unlinked and
    unregistered here, not left to the trainer's resource tracker, which would warn of them as leaked at the run's
    end."""
    util._run_finalizers(0)
    os._exit(code)


def _produce(cfg: Config, policy_dir: Path, port: int, first_step: int, first_version: int, results: Connection,
             acks: Connection) -> Any:
    from seedfast.envs.slots import counter_delta, counters_of
    from seedfast.rollout.agent_loop import run_agent_loop
    from seedfast.runtime.setup import (
        agent_config,
        device_of,
        load_run_tokenizer,
        load_tasks,
        make_env_slots,
    )
    from seedfast.seeds import sampling_seed, step_seed
    from seedfast.train.draws import choose_tasks, seed_everything, task_pool

    device = producer_device(cfg, device_of(cfg))  # runtime/placement.py
    engine = producer_engine(cfg, policy_dir, device)
    tokenizer = load_run_tokenizer(cfg, policy_dir)
    tasks = task_pool(load_tasks(cfg, "train", skipped=[]), cfg.rollout.task_pool, cfg.run.seed)
    envs = make_env_slots(cfg, cfg.env.slots or max(cfg.rollout.tasks_per_batch * cfg.rollout.n, 1))
    agent = agent_config(cfg, n=cfg.rollout.n, temperature=cfg.rollout.temperature)
    # the receiver waits for the next version as long as the trainer learns: no timeout (the lifeline ends it)
    channel = WeightChannel.connect(port, device, timeout_s=cfg.rollout.producer_timeout_s,
                                      wait_forever=True)
    staged = _Staged()
    results.send_bytes(pickle.dumps(_Ready(pid=os.getpid())))
    threading.Thread(target=staged.receive, args=(channel, engine.layout, channel_dtype(cfg), acks), name="weights",
                     daemon=True).start()
    loaded: int | None = None
    loaded_print: int | None = None
    try:
        for step in range(first_step, cfg.trainer.steps):
            version = rollout_version(step, cfg.rollout.max_staleness, first_version)
            if version != loaded:
                loaded, loaded_print = version, engine.load(staged.take(version))
            seed_everything(step_seed(cfg.run.seed, step))
            chosen = choose_tasks(tasks, cfg.rollout.tasks_per_batch, cfg.run.seed, step)
            engine.rollout.begin_step(sampling_seed(cfg.run.seed, step, 0))
            before = counters_of(envs)
            started = time.time()
            with torch.no_grad():
                result = run_agent_loop(engine.rollout, tokenizer, chosen, envs, agent)
            for t in result.trajectories:
                t.meta[VERSION_KEY] = version
            yield Produced(step, version, result, counter_delta(before, counters_of(envs), "rollout/env_"),
                           started, time.time(), loaded_print)
    finally:
        close = getattr(envs, "close", None)
        if close is not None:
            close()
        engine.close()
