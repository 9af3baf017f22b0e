"""A worker process that dies with the process that owns it, in every state, whatever ended the owner.

Two mechanisms, because neither covers every case alone:
- Linux's PR_SET_PDEATHSIG: the kernel SIGKILLs the worker when its parent dies, even while the worker is busy in
  C code, blocked or stopped. It only helps when the parent is the owner (the spawn start method; under a
  forkserver the parent is the server, which may outlive the owner).
- a lifeline pipe whose write end only the owner holds: a thread of the worker waits for its EOF, which comes when
  the owner dies, whoever started the worker and on any OS.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait

_PR_SET_PDEATHSIG = 1


def die_with_owner(lifeline: Connection) -> None:
    """Call first in the worker: from here on it exits as soon as the owner (the holder of the lifeline's write
    end, which never writes) is gone."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if lifeline.poll():  # the owner died before the line above: no signal will come
        os._exit(0)
    threading.Thread(target=_exit_at_eof, args=(lifeline,), name="owner-lifeline", daemon=True).start()


def _exit_at_eof(lifeline: Connection) -> None:
    wait([lifeline])
    os._exit(0)


class OwnedProcessPool(ProcessPoolExecutor):
    """A ProcessPoolExecutor whose workers die with this process, whatever ends it (the two mechanisms above; spawn,
    so that the owner is their parent). `shutdown(wait=False)` ends the running tasks too."""

    def __init__(self, max_workers: int, initializer: Callable[..., object] | None = None,
                 initargs: tuple = ()) -> None:
        ctx = get_context("spawn")
        self._lifeline_r, self._lifeline_w = ctx.Pipe(duplex=False)  # only this process holds the write end
        super().__init__(max_workers=max_workers, mp_context=ctx, initializer=_start_owned,
                         initargs=(self._lifeline_r, initializer, initargs))

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if not wait:
            self._lifeline_w.close()  # every worker exits now, whatever it is doing
        super().shutdown(wait=wait, cancel_futures=cancel_futures)
        self._lifeline_w.close()
        self._lifeline_r.close()


def _start_owned(lifeline: Connection, initializer: Callable[..., object] | None, initargs: tuple) -> None:
    die_with_owner(lifeline)
    if initializer is not None:
        initializer(*initargs)
