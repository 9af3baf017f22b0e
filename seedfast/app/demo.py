"""`seedfast demo CONFIG` (`make demo`): the whole pipeline on a CPU with a tiny model, written in
train/demo.py (main), built with train/setup.py."""

from seedfast.train.demo import main

__all__ = ["main"]
