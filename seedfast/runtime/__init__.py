"""What SFT and RL runs share: the builders of a run, the optimizer, checkpoints, metrics, profiling."""
