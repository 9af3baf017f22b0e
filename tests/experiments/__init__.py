"""Tests of the research experiments (experiments/): their read-outs by hand and the docs sections they generate."""
