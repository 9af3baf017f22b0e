"""Tests of seedfast.context: step samples, segments and the teacher context."""
