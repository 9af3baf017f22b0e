"""Tests of seedfast.ops: the fused log-prob and loss operators and their backends."""
