"""What SFT and RL runs share: the builders of a run, the run folder's layout, the optimizer, checkpoints, metrics,
profiling."""
