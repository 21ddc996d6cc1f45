"""A GPT-2 style decoder in one file: `from model.gpt import GPT, GPTConfig`."""
