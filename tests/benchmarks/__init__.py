"""Tests of the benchmark scripts of benchmarks/."""
