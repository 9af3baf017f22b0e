"""Tests against the real vLLM (CPU build), run by `make test-vllm` in a venv of their own."""
