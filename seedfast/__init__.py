"""seedfast: fast agentic RL with on-policy self-distillation."""

__version__ = "0.1.0"
