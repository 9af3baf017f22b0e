"""Tests of seedfast.kernels: the Triton kernels (interpreter on CPU, GPU where there is one)."""
