"""Tests of seedfast.sft: the SFT data and loop."""
