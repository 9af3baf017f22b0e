"""Tests of seedfast.app: the commands, the demo and its lanes."""
