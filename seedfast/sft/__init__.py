"""Stage-1 supervised fine-tuning: examples, the packed training loop, walkthrough replays and their renamed
copies, the copy warm-up."""
