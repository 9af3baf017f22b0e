"""Kernel tests: on a machine without CUDA the Triton kernels run under the interpreter (TRITON_INTERPRET=1;
tests/kernels/interpreter.py). On a CUDA machine the kernels stay compiled, the interpreter tests skip and the `gpu`
tests run.
"""

import os

import pytest

from tests.kernels.interpreter import run_kernels_under_the_interpreter

run_kernels_under_the_interpreter()


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            # The interpreter evaluates masked-out lanes too (exp(-inf)·(-inf), log 0): numpy warns, results
            # are selected away by tl.where.
            item.add_marker(pytest.mark.filterwarnings("ignore::RuntimeWarning"))
