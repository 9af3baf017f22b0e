"""Tests of seedfast.train: the RL update, its steps, evaluation and resume."""
