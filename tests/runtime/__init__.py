"""Tests of seedfast.runtime: optimizer, checkpoints, precision and progress."""
