"""Tests of seedfast.algo: the losses, advantages and their math."""
