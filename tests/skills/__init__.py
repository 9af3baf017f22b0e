"""Tests of seedfast.skills: analyzers, the skill library and reflection prompts."""
