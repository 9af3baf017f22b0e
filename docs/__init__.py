"""The docs' generators (`python -m docs.generate`, `make docs`): a package so that they run from the repository's
root like the benchmarks and experiments, and no other installed `docs` module can stand in for this one."""
