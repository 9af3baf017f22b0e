"""Triton kernels only (installed as seedfast.kernels). No autograd, no framework glue."""
