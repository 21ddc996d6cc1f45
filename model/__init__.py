"""A GPT-2 style decoder; see gpt.py."""

from model.gpt import GPT, GPTConfig, PRESETS

__all__ = ["GPT", "GPTConfig", "PRESETS"]
