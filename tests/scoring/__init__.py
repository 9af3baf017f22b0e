"""Tests of seedfast.scoring: student and teacher scores of step samples."""
