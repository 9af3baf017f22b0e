"""Every seed seedfast derives, in one place: from the run's seeds (run.seed, env.games_seed) and counters (the RL
update, the data-parallel rank, the evaluation chunk, the generate call), never from time or process state, so a
resumed run, N processes and one process draw what they should. Each function says why it exists; callers pass
its result to a generator (torch, numpy, random, vLLM) and derive nothing themselves.

The numbers are frozen (tests/test_seeds.py pins them): resumed runs, the overfit test and the committed benchmark
results depend on identical draws. A new stream gets a new function here, never a tweak of an old one.

Imports nothing: every package may import it (tests/test_import_direction.py).
"""

from __future__ import annotations

# Seeds stay in [0, MODULUS): a positive 31-bit int every generator accepts.
MODULUS = 2**31 - 1
# Primes that space streams apart: a step's seed moves by STEP_STRIDE, a data-parallel rank's by RANK_STRIDE.
RUN_STRIDE, STEP_STRIDE, RANK_STRIDE = 1_000_003, 7_919, 104_729
# TextWorld eval games are generated from env.games_seed + EVAL_GAME_SEED_OFFSET on: never a train game's seed.
EVAL_GAME_SEED_OFFSET = 1_000_000
# numpy SeedSequence tag of the fixed RL task pool, apart from the per-step task draws ([run.seed, step]).
_TASK_POOL_TAG = 0x9001
# numpy SeedSequence tag of the shuffled-skill control's derangements (docs/study.md), apart from every other stream.
_SKILL_SHUFFLE_TAG = 0x5EED


def step_seed(run_seed: int, step: int) -> int:
    """RL update `step`: the global RNGs (train/draws.py seed_everything) and the base of the step's other seeds, so a
    resumed run redraws what the uninterrupted run drew."""
    return (run_seed * RUN_STRIDE + step * STEP_STRIDE) % MODULUS


def sampling_seed(run_seed: int, step: int, dp_rank: int = 0) -> int:
    """The rollout's sampling seed on data-parallel rank `dp_rank`: ranks play different tasks and must not share
    noise; one process and rank 0 keep the step seed; tensor-parallel peers share a rank and so a seed (the
    vocabulary-parallel sampler needs the same noise on every shard)."""
    seed = step_seed(run_seed, step)
    return seed if dp_rank == 0 else (seed + RANK_STRIDE * dp_rank) % MODULUS


def analyzer_seed(run_seed: int, step: int, dp_rank: int = 0) -> int:
    """The engine's seed for the privileged-text phase (SEED's self-analysis, GRSD's reflections and guidance):
    the rollout's sampling seed again, so the analyzer's draws do not depend on how many generate calls the
    rollout made before it."""
    return sampling_seed(run_seed, step, dp_rank)


def update_seed(run_seed: int, step: int) -> int:
    """The mini-batch order of update `step` (each PPO epoch's permutation): its own generator, apart from the
    global RNGs the step seed sets."""
    return step_seed(run_seed, step) + 1


def task_pool_seed(run_seed: int) -> list[int]:
    """numpy entropy of the fixed RL task pool (rollout.task_pool games drawn once per run): tagged apart from the
    per-step draws of `task_choice_seed`."""
    return [run_seed, _TASK_POOL_TAG]


def task_choice_seed(run_seed: int, step: int) -> list[int]:
    """numpy entropy of update `step`'s task draw from the pool: the same on every rank (each then plays its
    share), and a function of the step alone, so a resumed run draws the same games."""
    return [run_seed, step]


def skill_shuffle_seed(run_seed: int, step: int) -> list[int]:
    """numpy entropy of update `step`'s skill derangement (skill.shuffle=derange, the shuffled-skill control of
    docs/study.md): which game's skills each game's trajectories read, a function of (run.seed, step) alone, tagged
    apart from the task draws of the same update."""
    return [run_seed, step, _SKILL_SHUFFLE_TAG]


def eval_seed(run_seed: int) -> int:
    """Every evaluation of a run (in-loop after any update, `seedfast eval` afterwards): the run's seed itself, not
    the step's, so one policy gets one set of numbers wherever it is evaluated and successive evaluations differ
    by the policy alone (the same draws)."""
    return run_seed


def eval_chunk_seed(seed: int, chunk: int) -> int:
    """Chunk `chunk` of an evaluation (train/evaluate.py): chunks are played by any rank, so their seeds depend on
    the chunk alone; chunk 0 plays with `seed` itself (one chunk is the one-batch evaluation)."""
    return (seed + chunk * STEP_STRIDE) % MODULUS


def request_seed(step_seed: int, call: int, index: int) -> int:
    """vLLM request `index` of generate call `call` within a step (rollout/colocated.py): a function of those three
    alone, so copies of one prompt draw differently and a resumed run draws the same (a 48-bit mix, then folded
    into [0, MODULUS))."""
    x = (step_seed * 0x9E3779B1 + call * 0x85EBCA77 + index * 0xC2B2AE3D) & 0xFFFFFFFFFFFF
    x ^= x >> 17
    x = (x * 0x27D4EB2F) & 0xFFFFFFFFFFFF
    return (x ^ (x >> 15)) % MODULUS


def copy_warmup_seed(seed: int, step: int) -> int:
    """The copy warm-up's examples of optimizer step `step` (sft/copy_warmup.py): fresh examples every step, the
    same on every rank and in every rerun."""
    return seed * RUN_STRIDE + step


def replay_seed(seed: int, game_id: str) -> str:
    """The wrong action of a walkthrough replay's failed variant (sft/replay.py): per game, so a game's failures
    do not change when other games join or leave the set (a str: `random.Random` hashes it stably)."""
    return f"{seed}:{game_id}"


def first_game_seed(games_seed: int, split: str) -> int:
    """The first TextWorld generation seed of `split` (envs/textworld_games.py; game i tries seeds from here on):
    train and eval games of one env.games_seed never share a seed."""
    return games_seed if split == "train" else games_seed + EVAL_GAME_SEED_OFFSET
