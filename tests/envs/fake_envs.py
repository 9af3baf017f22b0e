"""Environment factories for the worker-pool tests; a module of its own so that worker processes can import them."""

import os
import signal
from pathlib import Path

from seedfast.envs.base import Observation
from seedfast.envs.textworld_env import TextWorldEnv

CRASH = "crash"  # the action that kills the worker process running it
BREAK_IMPORT = "SEEDFAST_FAKE_ENVS_BROKEN"  # names a file; while it exists, a new worker cannot import this module

if os.environ.get(BREAK_IMPORT) and Path(os.environ[BREAK_IMPORT]).exists():
    raise ImportError("fake_envs: broken on purpose")


class CrashingEnv(TextWorldEnv):
    """A TextWorld game whose worker dies (SIGKILL, as the OOM killer would) on the action CRASH."""

    def step(self, action):
        if action == CRASH:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action)


class ProcessBoundEnv:
    """An environment whose observations name the process it runs in: a replay on another process never matches,
    as with a game that is not deterministic. Dies on the action CRASH."""

    def __init__(self, spec):
        self.spec = spec

    def reset(self):
        return Observation(f"{self.spec} in process {os.getpid()}", "wait", ["wait", CRASH])

    def step(self, action):
        if action == CRASH:
            os.kill(os.getpid(), signal.SIGKILL)
        return self.reset(), 0.0, False, {"won": False, "lost": False, "valid": True}

    def close(self):
        pass
