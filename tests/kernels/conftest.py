"""Kernel tests: on a machine without CUDA the Triton kernels run under the interpreter (TRITON_INTERPRET=1).

The variable must be set before the @triton.jit decorators of seedfast.kernels run. It is process-wide, so it
is set only where no GPU exists (there nothing compiles Triton code anyway); if another test folder imported
seedfast.kernels first, its modules are re-created here. On a CUDA machine the kernels stay compiled, the
interpreter tests skip and the `gpu` tests run.
"""

import importlib
import os
import sys

import pytest
import torch

from seedfast.kernels.interpreter_patches import patch_interpreter

INTERPRET = not torch.cuda.is_available()


if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"
    patch_interpreter()
    stale = sorted(name for name in sys.modules if name.startswith("seedfast.kernels."))
    for name in sorted(stale, key=lambda n: n.endswith(".autotuned")):  # autotuned wraps the others: last
        importlib.reload(sys.modules[name])


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            # The interpreter evaluates masked-out lanes too (exp(-inf)·(-inf), log 0): numpy warns, results
            # are selected away by tl.where.
            item.add_marker(pytest.mark.filterwarnings("ignore::RuntimeWarning"))
