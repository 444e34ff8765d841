"""The built-in MoE models (real Hugging Face checkpoints: Mixtral-architecture builtin, DeepSeek-V3-architecture
builtin-fine) and their corpus.

- ``corpus``: five tasks (code, docs, austen, bible, wiki) split by document; ``load_corpus``.
- ``prompts``: capture prompts with per-task lengths and Poisson arrivals; JSONL prompts files.
- ``tokenizer``: the byte-level BPE tokenizer.
- ``train``: ``train_builtin`` and ``eval_per_domain``.
- ``builtin``: ``builtin_path`` and ``load_builtin`` for the shipped checkpoints, ``load_model`` for any saved one.

Imports here are light (no torch/transformers until a function needs them).
"""

from __future__ import annotations

import importlib

# Resolved on first access, so `python -m routecast.models.corpus` does not import its own module twice.
_EXPORTS = {
    "TASKS": "corpus", "Document": "corpus", "load_corpus": "corpus",
    "PromptConfig": "prompts", "PromptRecord": "prompts", "build_prompts": "prompts",
    "read_prompts": "prompts", "write_prompts": "prompts",
    "builtin_path": "builtin", "load_builtin": "builtin",
    "train_builtin": "train", "eval_per_domain": "train",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"routecast.models.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'routecast.models' has no attribute {name!r}")
