"""glibc's malloc set to keep the memory a process frees, for the next training step, instead of returning it to the
OS and faulting it in again.

By default glibc serves an allocation above a threshold (128 KiB, raised as such blocks are freed, up to 32 MiB)
with its own mmap, unmapped when freed, and gives the top of its heap back once more than twice that threshold is
free. A trainer's step allocates and frees the same activations every step, each time in fresh pages the kernel
must map and zero one by one (docs/performance.md, "Host memory"; benchmarks/host_memory.py measures the demo's SFT
both ways). A process keeps up to MALLOC_TRIM_THRESHOLD_ of freed memory at its heap's top.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys

# glibc's tunables, as environment variables (read by a process as it starts) and as mallopt's parameter numbers
SETTINGS = {"MALLOC_MMAP_THRESHOLD_": 32 << 20,  # glibc's largest: blocks below it come from the heap, reused
            "MALLOC_TRIM_THRESHOLD_": 1 << 30,  # free memory at the heap's top kept, up to this
            "MALLOC_TOP_PAD_": 256 << 20}  # the heap grows by this much more than asked: fewer system calls
_MALLOPT = {"MALLOC_MMAP_THRESHOLD_": -3, "MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_TOP_PAD_": -2}


def keep_freed_memory() -> bool:
    """Apply SETTINGS to this process (mallopt) and to the processes it starts (their environment); a value the
    user set in the environment wins. Linux with glibc only: False elsewhere, where nothing changes."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (glibc only: musl's mallopt does nothing)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    for name, default in SETTINGS.items():
        raw = os.environ.setdefault(name, str(default))
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"{name}={raw!r} in the environment is not a whole number of bytes") from None
        if mallopt(_MALLOPT[name], value) != 1:
            raise ValueError(f"glibc refused {name}={value} (mallopt)")
    return True


def give_back_freed_memory() -> bool:
    """Return the memory this process has freed to the OS now (glibc's malloc_trim, every arena, free pages inside
    the heap too): for a process whose training is over while it lives on, such as `seedfast demo` after SFT, whose
    jobs then run in processes of their own. Kept, SmolLM2's SFT left ~10 GB with the demo's parent while two lanes
    loaded the model beside it, and a 24 GB box ran out of memory. False where this is not glibc."""
    if not sys.platform.startswith("linux"):
        return False
    gc.collect()
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim(0)
    return True
