"""The kernel benchmarks' tests run the kernels they time (benchmarks/gemm_reference.py's row passes) under Triton's
interpreter where no GPU exists, as tests/kernels/ does."""

from tests.kernels.interpreter import run_kernels_under_the_interpreter

run_kernels_under_the_interpreter()
