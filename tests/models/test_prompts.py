"""Capture prompts: Poisson arrivals, per-task lengths, reproducibility, and the JSONL prompts file."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from routecast.common.errors import ConfigError
from routecast.models.prompts import (
    DEFAULT_LENGTHS,
    LengthSpec,
    PromptConfig,
    build_prompts,
    poisson_arrivals,
    read_prompts,
    write_prompts,
)


@pytest.fixture(scope="module")
def records(small_tokenizer):
    return build_prompts(small_tokenizer, PromptConfig(n_requests=40, rate=5.0, seed=7))


def test_arrivals_increase_and_ids_are_in_order(records):
    arrivals = np.array([r.arrival_s for r in records])
    assert (np.diff(arrivals) > 0).all() and arrivals[0] > 0
    assert [r.request for r in records] == list(range(len(records)))


def test_lengths_within_documented_ranges(records):
    assert {r.task for r in records} == set(DEFAULT_LENGTHS)
    for r in records:
        spec = DEFAULT_LENGTHS[r.task]
        assert spec.new_min <= r.max_new_tokens <= spec.new_max
        assert 1 <= len(r.prompt_ids) <= spec.prompt_max
        assert len(r.prompt_ids) + r.max_new_tokens <= 256  # the built-in model trained on 256
        assert r.prompt_text.strip()
    # Documents are long enough that most prompts get their full drawn length.
    assert np.mean([len(r.prompt_ids) >= DEFAULT_LENGTHS[r.task].prompt_min for r in records]) > 0.9


def test_code_prompts_are_longer_than_bible_prompts(small_tokenizer):
    recs = build_prompts(small_tokenizer, PromptConfig(n_requests=60, mix={"code": 1, "bible": 1}, seed=1))
    code = [len(r.prompt_ids) for r in recs if r.task == "code"]
    bible = [len(r.prompt_ids) for r in recs if r.task == "bible"]
    assert code and bible and np.mean(code) > 1.5 * np.mean(bible)


def test_seed_reproducibility(small_tokenizer, records):
    again = build_prompts(small_tokenizer, PromptConfig(n_requests=40, rate=5.0, seed=7))
    assert again == records
    other = build_prompts(small_tokenizer, PromptConfig(n_requests=40, rate=5.0, seed=8))
    assert [r.prompt_ids for r in other] != [r.prompt_ids for r in records]


def test_poisson_rate_and_offline_batch():
    gaps = np.diff(poisson_arrivals(20_000, 4.0, np.random.default_rng(0)), prepend=0.0)
    assert abs(gaps.mean() - 0.25) < 0.01 and abs(gaps.std() - 0.25) < 0.015  # exponential: mean = std
    assert (poisson_arrivals(5, float("inf"), np.random.default_rng(0)) == 0).all()


def test_config_validation():
    with pytest.raises(ConfigError, match="rate"):
        PromptConfig(rate=0)
    with pytest.raises(ConfigError, match="n_requests"):
        PromptConfig(n_requests=0)
    with pytest.raises(ConfigError, match="split"):
        PromptConfig(split="dev")
    with pytest.raises(ConfigError, match="LengthSpec"):
        LengthSpec(prompt_min=10, prompt_max=5, new_min=1, new_max=2)


def test_unknown_task_in_mix(small_tokenizer):
    with pytest.raises(ConfigError, match="poetry"):
        build_prompts(small_tokenizer, PromptConfig(mix={"poetry": 1.0}))


def test_jsonl_round_trip(tmp_path, records):
    path = write_prompts(tmp_path / "p.jsonl", records)
    back = read_prompts(path)
    assert len(back) == len(records)
    for a, b in zip(records, back, strict=True):
        assert (a.request, a.task, a.prompt_text, a.max_new_tokens, a.arrival_s, a.document) == (
            b.request, b.task, b.prompt_text, b.max_new_tokens, b.arrival_s, b.document)
    assert dataclasses.replace(back[0], prompt_ids=None).prompt_ids is None


def test_every_prompt_names_the_document_it_was_cut_from(records):
    from routecast.models.corpus import load_corpus

    texts = {f"{d.task}/{d.doc_id}": d.text for d in load_corpus("test")}
    for r in records:
        assert r.document.startswith(r.task + "/") and r.document in texts
        assert r.prompt_text.strip()[:40] in texts[r.document]  # the window really comes from that document
    assert len({r.document for r in records}) < len(records)  # several windows share a document


def test_defaults_for_optional_fields(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hello"}\n\n{"prompt": "world", "arrival_s": 1.5}\n')
    recs = read_prompts(path)
    assert [(r.request, r.task, r.max_new_tokens, r.arrival_s) for r in recs] == [
        (0, "unknown", 32, 0.0), (1, "unknown", 32, 1.5)]


@pytest.mark.parametrize("bad_line, message", [
    ('{"prompt": "a", ', "not valid JSON"),
    ('["a"]', "expected a JSON object"),
    ('{"task": "code"}', "'prompt' field is missing"),
    ('{"prompt": 3}', "field 'prompt' is 3"),
    ('{"prompt": "a", "max_new_tokens": 0}', "max_new_tokens is 0"),
    ('{"prompt": "a", "max_new_tokens": "8"}', "field 'max_new_tokens'"),
    ('{"prompt": "a", "arrival_s": -1}', "arrival_s is -1"),
    ('{"prompt": "a", "arrival_s": 0.5}', "earlier than line 1"),
    ('{"prompt": "a", "arrival_s": 2, "request": 0}', "repeats line 1"),
])
def test_bad_line_names_file_and_line(tmp_path, bad_line, message):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "ok", "arrival_s": 1.0, "request": 0}) + "\n" + bad_line + "\n")
    with pytest.raises(ConfigError, match=message) as err:
        read_prompts(path)
    assert f"{path} line 2" in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        read_prompts(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ConfigError, match="no requests"):
        read_prompts(tmp_path / "empty.jsonl")
