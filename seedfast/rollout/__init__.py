"""Rollout: generation engines (own KV-cache sampler, vLLM), per-step prompts, the multi-turn agent loop,
and stage-1 collection (`seedfast collect`, in seedfast.rollout.collect)."""

from seedfast.envs.slots import EnvSlots, LocalEnvSlots, PoolEnvSlots
from seedfast.rollout.actions import parse_action
from seedfast.rollout.agent_loop import AgentLoopConfig, Task, run_agent_loop, stop_token_ids
from seedfast.rollout.engine import Generation, GenerationEngine
from seedfast.rollout.own_engine import Sampler
from seedfast.rollout.prompts import Prompt, PromptStyle, Turn, build_prompt
from seedfast.rollout.records import RolloutResult, RolloutStats, StepRecord
from seedfast.rollout.sampling import sample_next, top_p_keep_mask

__all__ = [
    "AgentLoopConfig", "EnvSlots", "Generation", "GenerationEngine", "LocalEnvSlots", "PoolEnvSlots", "Prompt",
    "PromptStyle", "RolloutResult", "RolloutStats", "Sampler", "StepRecord", "Task", "Turn",
    "build_prompt", "parse_action", "run_agent_loop", "sample_next",
    "stop_token_ids", "top_p_keep_mask",
]
