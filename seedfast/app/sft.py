"""`seedfast sft CONFIG`: supervised fine-tuning (skill writing, + behaviour cloning), written in
train/sft.py (main), whose policy, device and dtype come from train/setup.py."""

from seedfast.train.sft import main

__all__ = ["main"]
