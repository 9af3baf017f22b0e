"""Stage 2, reinforcement learning (docs/architecture.md, 'One RL step, file by file'): the RL loop (`rl.py`) and
what each algorithm does (`algorithms.py`, `privileged.py`, GRSD's reflection update in `reflection.py`), the step
samples (`batch.py`), the update and what one step computes (`update.py`, `step_plan.py`, `correction.py`), the
draws of an update (`draws.py`), the asynchronous rollout producer and its staleness rule (`async_rollout.py`,
`staleness.py`), the teacher's evidence in the metrics (`teacher_evidence.py`) and evaluation on held-out games
(`evaluate.py`)."""
