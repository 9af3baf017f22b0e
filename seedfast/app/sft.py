"""`seedfast sft CONFIG`: supervised fine-tuning (skill writing, + behaviour cloning), written in
sft/run.py (main), whose policy, device and dtype come from runtime/setup.py."""

from seedfast.sft.run import main

__all__ = ["main"]
