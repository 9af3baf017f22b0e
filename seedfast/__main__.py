"""`python -m seedfast ...` (also what `torchrun -m seedfast ...` runs)."""

from seedfast.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
