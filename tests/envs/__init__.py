"""Tests of seedfast.envs: TextWorld games, environments and their worker processes."""
