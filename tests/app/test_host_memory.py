"""app/host_memory.py: with glibc's malloc set to keep freed memory, a step that allocates and frees the same
activations again stops faulting their pages in every time; the settings reach the processes a command starts; the
`seedfast` program sets them, cli.main called from another program does not."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from seedfast.app.host_memory import SETTINGS

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux")

# A training step in miniature, through malloc itself (torch's CPU tensors come from it too, but the small blocks
# torch allocates between them make glibc's default behaviour vary from run to run): 20 activations of 2 MiB held
# together, written, then freed together. The page faults of 4 steps after a first one, which faults its memory in
# under any setting.
_STEPS = """
import ctypes, resource, sys
from seedfast.app.host_memory import keep_freed_memory
if sys.argv[1] == "kept":
    assert keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
def step():
    held = [libc.malloc(2 << 20) for _ in range(20)]
    for block in held:
        ctypes.memset(block, 1, 2 << 20)
    for block in held:
        libc.free(block)
libc.free(libc.malloc(4 << 20))  # glibc's own threshold rises to 4 MiB: the 2 MiB blocks come from its heap
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in SETTINGS}


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _STEPS, mode], env=_clean_env(), capture_output=True, text=True,
                         check=True)
    return int(out.stdout.split()[-1])


def test_freed_memory_is_reused_without_page_faults():
    pages = 4 * 20 * (2 << 20) // 4096
    assert _faults("default") > 0.9 * pages  # glibc gave each step's memory back and faulted it in again
    assert _faults("kept") < 0.02 * pages


def test_settings_reach_child_processes_and_a_users_value_wins():
    code = ("import os, subprocess, sys\n"
            "from seedfast.app.host_memory import keep_freed_memory\n"
            "assert keep_freed_memory()\n"
            "subprocess.run([sys.executable, '-c', \"import os; print(os.environ['MALLOC_TRIM_THRESHOLD_'], "
            "os.environ['MALLOC_TOP_PAD_'])\"], check=True)\n")
    env = {**_clean_env(), "MALLOC_TOP_PAD_": str(1 << 20)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(SETTINGS["MALLOC_TRIM_THRESHOLD_"]), str(1 << 20)]


@pytest.mark.parametrize("call,kept", [("entry()", True), ("main(['config'])", False)])
def test_the_seedfast_program_keeps_freed_memory_and_main_alone_does_not(call, kept):
    """`seedfast` and `python -m seedfast` run cli.entry, which sets the process's malloc; cli.main called from another
    program (a test, a notebook) leaves that program's malloc and environment as they were."""
    code = ("import contextlib, io, os, sys\n"
            "from seedfast import cli\n"
            "sys.argv = ['seedfast', 'config']\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert cli.{call} == 0\n"
            "print('MALLOC_TRIM_THRESHOLD_' in os.environ)\n")
    out = subprocess.run([sys.executable, "-c", code], env=_clean_env(), capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == str(kept)


def test_a_bad_malloc_variable_is_one_line_naming_it():
    env = {**_clean_env(), "MALLOC_TOP_PAD_": "lots"}
    out = subprocess.run([sys.executable, "-c", "import sys; from seedfast.cli import entry; sys.exit(entry())"],
                         env=env, capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["seedfast: MALLOC_TOP_PAD_='lots' in the environment is not a whole "
                                               "number of bytes"]


# SFT in miniature: 400 blocks of 2 MiB from the heap (below the kept mmap threshold), written, then every other one
# freed: 400 MiB of holes between blocks still in use, which free() never returns. Resident memory after the frees,
# then after give_back_freed_memory.
_GIVE_BACK = """
import ctypes, os, sys
from seedfast.app.host_memory import give_back_freed_memory, keep_freed_memory
assert keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
def resident_mib():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20
held = [libc.malloc(2 << 20) for _ in range(400)]
for block in held:
    ctypes.memset(block, 1, 2 << 20)
for block in held[::2]:
    libc.free(block)
kept = resident_mib()
assert give_back_freed_memory()
print(kept, resident_mib())
"""


def test_a_process_done_training_gives_its_freed_memory_back():
    out = subprocess.run([sys.executable, "-c", _GIVE_BACK], env=_clean_env(), capture_output=True, text=True,
                         check=True)
    kept, after = map(int, out.stdout.split())
    assert kept > 750  # the 400 MiB freed stay with the process beside the 400 MiB in use
    assert after < kept - 350  # and go back to the OS
