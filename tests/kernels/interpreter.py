"""Where no GPU exists, the Triton kernels run under the interpreter (TRITON_INTERPRET=1), for every test folder
that runs them (tests/kernels/, and tests/benchmarks/ for the kernel benchmarks' own kernels).

The variable must be set before the @triton.jit decorators of seedfast.kernels run. It is process-wide, so it
is set only where no GPU exists (there nothing compiles Triton code anyway); if another test folder imported
seedfast.kernels first, its modules are re-created here.
"""

import importlib
import os
import sys

import torch

from seedfast.kernels.interpreter_patches import patch_interpreter


def run_kernels_under_the_interpreter() -> None:
    if torch.cuda.is_available():
        return
    os.environ["TRITON_INTERPRET"] = "1"
    patch_interpreter()
    stale = sorted(name for name in sys.modules if name.startswith("seedfast.kernels."))
    for name in sorted(stale, key=lambda n: n.endswith(".autotuned")):  # autotuned wraps the others: last
        importlib.reload(sys.modules[name])
