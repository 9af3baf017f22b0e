"""Tests of seedfast.distributed: FSDP2, tensor parallel, checkpoints and weight pushes on CPU gloo ranks."""
