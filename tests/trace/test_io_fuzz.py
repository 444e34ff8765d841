"""Fuzz the reader: any corruption of any file yields a valid Trace or a TraceError, never anything else."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routecast.common.errors import TraceError
from routecast.trace.io import read_trace, write_trace
from routecast.trace.summary import inspect_trace
from routecast.trace.trace import Trace

FILES = ["trace.json", "tokens.parquet", "routing-00000.safetensors", "routing-00002.safetensors"]
# derandomize: the same examples on every run (reproducible CI); ~30 ms an example keeps the
# file under ~20 s on a busy machine
FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
                           | st.text(max_size=8), lambda v: st.lists(v, max_size=3)
                           | st.dictionaries(st.text(max_size=6), v, max_size=3), max_leaves=6)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    from tests.conftest import build_small_trace

    d = tmp_path_factory.mktemp("pristine") / "t"
    write_trace(build_small_trace(logits=True, hidden=4, dropped=0.1), d, shard_tokens=16)
    return d


def _check(d: Path) -> None:
    for mmap in (True, False):
        try:
            t = read_trace(d, mmap=mmap)
        except TraceError as e:
            assert str(e).endswith(".") and "\n" not in str(e)
        else:
            assert isinstance(t, Trace)
            t.validate()
    info = inspect_trace(d)
    assert isinstance(info["valid"], bool) and (info["valid"] or info["error"])


def _mutated(pristine: Path, file: str, mutate) -> Path:
    root = Path(tempfile.mkdtemp(prefix="fuzz-"))
    d = root / "t"
    shutil.copytree(pristine, d)
    mutate(d / file)
    return d


@FUZZ
@given(file=st.sampled_from(FILES), op=st.sampled_from(["flip", "truncate", "delete", "append", "zero"]),
       data=st.data())
def test_byte_corruption_is_valid_or_trace_error(pristine, file, op, data):
    size = (pristine / file).stat().st_size

    def mutate(f: Path) -> None:
        b = bytearray(f.read_bytes())
        if op == "delete":
            f.unlink()
            return
        if op == "flip":
            for p in data.draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=8), label="positions"):
                b[p] ^= data.draw(st.integers(1, 255), label="xor")
        elif op == "truncate":
            del b[data.draw(st.integers(0, size - 1), label="keep"):]
        elif op == "append":
            b += data.draw(st.binary(min_size=1, max_size=64), label="tail")
        else:
            a = data.draw(st.integers(0, size - 1), label="start")
            n = min(data.draw(st.integers(1, 256), label="len"), size - a)
            b[a: a + n] = bytes(n)
        f.write_bytes(bytes(b))

    d = _mutated(pristine, file, mutate)
    try:
        _check(d)
    finally:
        shutil.rmtree(d.parent)


@FUZZ
@given(where=st.sampled_from(["top", "spec", "shard", "tensors"]), key=st.text(max_size=12) | st.sampled_from(
    ["schema_version", "num_tokens", "task_names", "source_names", "provenance", "shards", "tensors", "spec",
     "num_layers", "num_experts", "top_k", "hidden_size", "layer_ids", "n_group", "file", "rows", "bytes",
     "logits_TLE", "hidden_TLH"]), value=json_values)
def test_trace_json_field_corruption_is_valid_or_trace_error(pristine, where, key, value):
    def mutate(f: Path) -> None:
        m = json.loads(f.read_text())
        target = {"top": m, "spec": m["spec"], "shard": m["shards"][1], "tensors": m["tensors"]}[where]
        target[key] = value
        f.write_text(json.dumps(m))

    d = _mutated(pristine, "trace.json", mutate)
    try:
        _check(d)
    finally:
        shutil.rmtree(d.parent)
