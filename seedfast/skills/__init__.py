"""Skills: hindsight-skill analyzers (self / external / oracle), their prompt and validator, SDAR's skill
library, and GRSD's reflection, judge and guidance text."""

from seedfast.skills.analyzers import (
    ANALYZER_KINDS,
    Analyzer,
    ExternalAnalyzer,
    OracleAnalyzer,
    SelfAnalyzer,
    make_analyzer,
    oracle_answer,
)
from seedfast.skills.chat_client import ChatClient, ChatError
from seedfast.skills.library import DEFAULT_LIBRARY, SkillLibrary, task_type_of
from seedfast.skills.parse import extract_json_object, parse_skill_response
from seedfast.skills.policy_text import Completion, GenerationEngine, chat_prompt_ids, generate_completions
from seedfast.skills.prompts import analyzer_sft_messages, build_analyzer_messages, canonical_answer
from seedfast.skills.reflection import (
    AVOID_HEADING,
    DO_HEADING,
    ExternalJudge,
    Guidance,
    Judge,
    OracleJudge,
    Reflection,
    build_guidance_messages,
    build_judge_messages,
    build_reflection_messages,
    parse_judge_score,
    parse_reflection,
    validate_guidance,
)
from seedfast.skills.result import REASONS, SKILL_MODES, SkillResult, count_reasons

__all__ = [
    "ANALYZER_KINDS", "Analyzer", "ExternalAnalyzer", "OracleAnalyzer", "SelfAnalyzer", "make_analyzer",
    "oracle_answer", "ChatClient", "ChatError", "AVOID_HEADING", "DO_HEADING", "ExternalJudge", "Guidance",
    "Judge", "OracleJudge", "Reflection", "build_guidance_messages", "build_judge_messages",
    "build_reflection_messages", "parse_judge_score", "parse_reflection", "validate_guidance",
    "DEFAULT_LIBRARY", "SkillLibrary", "task_type_of", "extract_json_object", "parse_skill_response",
    "analyzer_sft_messages", "build_analyzer_messages", "canonical_answer", "REASONS", "SKILL_MODES",
    "SkillResult", "count_reasons", "Completion", "GenerationEngine", "chat_prompt_ids", "generate_completions",
]
