"""`python -m seedfast ...` (also what `torchrun -m seedfast ...` runs)."""

from seedfast.cli import entry

if __name__ == "__main__":
    raise SystemExit(entry())
