"""Performance benchmarks: speed and memory of seedfast's parts beside their references and peers, each a script run
from the repository's root as `python -m benchmarks.NAME` that prints a table and rewrites its one JSON in
results/ (machine, versions, shapes). What each measures: the README's "Benchmarks" list and docs/performance.md.
Research experiments (does an agent get better, and why) are in experiments/."""
