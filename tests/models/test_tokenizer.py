"""The byte-level BPE tokenizer: exact round trips on every domain, special tokens, offline loading."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from routecast.common.errors import ConfigError
from routecast.models.builtin import builtin_path
from routecast.models.corpus import TASKS, load_corpus
from routecast.models.tokenizer import BOS, EOS, PAD, load_tokenizer, train_tokenizer

EXTRA = ["", " leading space", "tabs\tand\r\nCRLF", "unicode: café, ☃, 日本語, emoji 🙂", "    indented = {1: [2]}\n"]


@pytest.fixture(scope="module")
def samples():
    """The first 2,000 characters of the first validation document of each task."""
    docs = load_corpus("val")
    return {t: next(d.text for d in docs if d.task == t)[:2000] for t in TASKS}


def test_round_trip_every_domain(small_tokenizer, samples):
    for task, text in samples.items():
        ids = small_tokenizer(text)["input_ids"]
        assert ids[0] == small_tokenizer.bos_token_id, task
        assert small_tokenizer.decode(ids, skip_special_tokens=True) == text, task
        assert len(ids) < len(text.encode()), task  # BPE merges compress every domain
    for text in EXTRA:
        ids = small_tokenizer(text, add_special_tokens=False)["input_ids"]
        assert small_tokenizer.decode(ids) == text


def test_special_tokens(small_tokenizer):
    assert (small_tokenizer.pad_token, small_tokenizer.bos_token, small_tokenizer.eos_token) == (PAD, BOS, EOS)
    assert (small_tokenizer.pad_token_id, small_tokenizer.bos_token_id, small_tokenizer.eos_token_id) == (0, 1, 2)
    assert len(small_tokenizer) == 512


def test_saved_tokenizer_loads_with_autotokenizer(tmp_path, small_tokenizer, samples):
    small_tokenizer.save_pretrained(str(tmp_path))
    assert (tmp_path / "tokenizer.json").is_file() and (tmp_path / "tokenizer_config.json").is_file()
    auto = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    text = samples["code"]
    assert auto(text)["input_ids"] == small_tokenizer(text)["input_ids"]
    assert auto.eos_token == EOS and auto.pad_token_id == 0


def test_bad_vocab_and_missing_files(tmp_path):
    with pytest.raises(ConfigError, match="vocab_size 100"):
        train_tokenizer(["abc"], vocab_size=100)
    with pytest.raises(ConfigError, match="tokenizer.json"):
        load_tokenizer(tmp_path)


@pytest.mark.skipif(not (builtin_path() / "tokenizer.json").is_file(), reason="built-in checkpoint not trained yet")
def test_builtin_tokenizer_round_trip(samples):
    tok = load_tokenizer(builtin_path())
    assert 4096 <= len(tok) <= 8192
    for task, text in samples.items():
        assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text, task
