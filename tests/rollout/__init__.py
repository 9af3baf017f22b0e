"""Tests of seedfast.rollout: the agent loop, sampling and the vLLM engines (a fake vLLM on CPU)."""
