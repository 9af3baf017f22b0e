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
