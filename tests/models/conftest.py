"""Fixtures for the built-in model tests: a small tokenizer and a tiny trained checkpoint (session-wide)."""

from __future__ import annotations

import pytest

from routecast.models.corpus import load_corpus
from routecast.models.tokenizer import balanced_texts, train_tokenizer
from routecast.models.train import tiny_config, train_builtin

# Smaller than the tiny preset so the whole test folder stays well under a minute on a shared core.
TEST_STEPS = 30


@pytest.fixture(scope="session")
def small_tokenizer():
    """Byte-level BPE (vocab 512) trained on ~40 KB of each task's shipped train sample."""
    return train_tokenizer(balanced_texts(load_corpus("train"), 40_000), vocab_size=512)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """(checkpoint dir, training record) of a tiny MixtralForCausalLM trained on the shipped sample."""
    out = tmp_path_factory.mktemp("tiny") / "model"
    cfg = tiny_config(steps=TEST_STEPS, max_train_bytes_per_task=60_000, tokenizer_bytes_per_task=40_000,
                      eval_every=TEST_STEPS, final_eval_tokens_per_task=512)
    record = train_builtin(out, config=cfg, seed=0, threads=1, progress=False)
    return out, record


@pytest.fixture(scope="session")
def tiny_fine_checkpoint(tmp_path_factory, tiny_checkpoint):
    """(checkpoint dir, record) of a tiny DeepseekV3ForCausalLM (16 experts top-4, 4 groups / 2) reusing tiny's tokenizer."""
    from routecast.models.train import _TINY_FINE, fine_config

    out = tmp_path_factory.mktemp("tinyfine") / "model"
    cfg = fine_config(**{**_TINY_FINE, "steps": TEST_STEPS, "max_train_bytes_per_task": 60_000,
                         "eval_every": TEST_STEPS, "final_eval_tokens_per_task": 512})
    record = train_builtin(out, config=cfg, seed=0, threads=1, progress=False, tokenizer_dir=tiny_checkpoint[0])
    return out, record
