"""Tests of seedfast.model: the decoder, its HF parity, tokenizers and checkpoint import."""
