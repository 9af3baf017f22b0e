"""Research experiments: whether agents get better with seedfast's algorithms and why, each a script run from the
repository's root as `python -m experiments.NAME` that writes its one current result in results/ (experiments/README.md
says what each one answers). Speed and memory benchmarks are in benchmarks/."""

from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"
