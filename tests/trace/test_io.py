"""On-disk trace format: round trips, memory mapping, TraceWriter semantics, one test per validation error."""

from __future__ import annotations

import json
import mmap as mmap_module
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from routecast.common.errors import ConfigError, TraceError
from routecast.trace import shards as trace_shards
from routecast.trace.io import TraceWriter, read_shard, read_trace, verify_trace, write_trace
from routecast.trace.summary import inspect_trace
from routecast.trace.trace import COLUMNS


def _mapped(a: np.ndarray) -> bool:
    """True when a's memory is a file mapping (its base chain reaches an np.memmap or mmap object)."""
    x = a
    while x is not None:
        if isinstance(x, (np.memmap, mmap_module.mmap)):
            return True
        x = getattr(x, "base", None)
    return False


@pytest.mark.parametrize(("logits", "hidden", "shard_tokens", "dropped"),
                         [(False, 0, 1000, 0.0), (True, 8, 7, 0.1), (True, 0, 1, 0.0), (False, 4, 13, 0.3)])
def test_round_trip(tmp_path, small_trace, assert_trace_equal, logits, hidden, shard_tokens, dropped):
    t = small_trace(5, logits=logits, hidden=hidden, dropped=dropped, seed=1)
    write_trace(t, tmp_path / "t", shard_tokens=shard_tokens)
    meta = json.loads((tmp_path / "t" / "trace.json").read_text())
    assert [s["rows"] for s in meta["shards"]] == [min(shard_tokens, t.num_tokens - a)
                                                   for a in range(0, t.num_tokens, shard_tokens)]
    for mm in (True, False):
        assert_trace_equal(read_trace(tmp_path / "t", mmap=mm), t)
    assert not (tmp_path / "t" / "_writer.json").exists() and not (tmp_path / "t" / ".lock").exists()


def test_round_trip_empty_trace_keeps_layout(tmp_path, small_trace, assert_trace_equal):
    t = small_trace(logits=True, hidden=4).select(np.zeros(0, dtype=int))
    write_trace(t, tmp_path / "e")
    r = read_trace(tmp_path / "e")
    assert r.num_tokens == 0 and r.logits_TLE.shape == (0, 3, 8) and r.hidden_TLH.shape == (0, 3, 4)
    assert_trace_equal(r, t)


def test_single_shard_is_memory_mapped_not_copied(tmp_path, small_trace):
    t = small_trace(logits=True, hidden=4)
    write_trace(t, tmp_path / "one")
    r = read_trace(tmp_path / "one")
    for a in (r.experts_TLK, r.weights_TLK, r.logits_TLE, r.hidden_TLH):
        assert _mapped(a) and not a.flags.writeable and not a.flags.owndata
    assert np.shares_memory(r.experts_TLK, r.weights_TLK.base)  # views of one mapping of the shard
    w = read_trace(tmp_path / "one", mmap=False)
    assert not _mapped(w.experts_TLK) and w.experts_TLK.flags.writeable


def test_several_shards_concatenate_into_memory(tmp_path, small_trace):
    write_trace(small_trace(), tmp_path / "many", shard_tokens=8)
    r = read_trace(tmp_path / "many")
    assert not _mapped(r.experts_TLK) and r.experts_TLK.flags.owndata


def test_skip_hidden_and_logits(tmp_path, small_trace):
    write_trace(small_trace(logits=True, hidden=4), tmp_path / "t")
    r = read_trace(tmp_path / "t", load_hidden=False, load_logits=False)
    assert r.hidden_TLH is None and r.logits_TLE is None


def test_writer_commits_whole_appends_and_counts(tmp_path, small_trace):
    t = small_trace(5)
    with TraceWriter(tmp_path / "w", t.spec, task_names=t.task_names, source_names=t.source_names,
                     shard_tokens=15) as w:
        for _, idx in t.requests():  # 10 rows per request: a shard commits at 20 rows, never splitting one
            sub = t.select(idx)
            w.append(sub.tokens, sub.experts_TLK, sub.weights_TLK)
            assert w.num_tokens == sum(len(i) for r, i in t.requests() if r <= sub.request[0])
        assert list(w.committed_requests()) == [0, 1, 2, 3]
        w.flush()
        w.flush()  # nothing buffered: no empty shard
        assert list(w.committed_requests()) == list(range(5))
    meta = json.loads((tmp_path / "w" / "trace.json").read_text())
    assert [s["rows"] for s in meta["shards"]] == [20, 20, 10]
    assert meta["provenance"] == {}


def test_writer_casts_and_copies_inputs(tmp_path, small_trace, assert_trace_equal):
    t = small_trace()
    e, w64 = t.experts_TLK.astype(np.int64), t.weights_TLK.astype(np.float64)
    with TraceWriter(tmp_path / "c", t.spec, task_names=t.task_names, source_names=t.source_names,
                     provenance={"n": np.int64(3), "p": tmp_path}) as w:
        w.append(dict(t.tokens), e, w64)
        e[:] = 0  # the writer buffered a copy
    r = read_trace(tmp_path / "c")
    assert r.weights_TLK.dtype == np.float32 and r.provenance == {"n": 3, "p": str(tmp_path)}
    assert_trace_equal(r, t, check_provenance=False)


def test_append_fills_missing_columns_with_defaults(tmp_path, small_trace):
    t = small_trace()
    with TraceWriter(tmp_path / "d", t.spec) as w:
        w.append({"request": t.request}, t.experts_TLK, t.weights_TLK)
    r = read_trace(tmp_path / "d")
    assert (r.task == -1).all() and (r.token_id == -1).all() and np.array_equal(r.request, t.request)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"experts_TLK": "bad_ids"}, "experts_TLK holds 99"),
    ({"experts_TLK": "float"}, "experts_TLK holds float"),
    ({"weights_TLK": "nan"}, "weights_TLK holds NaN"),
    ({"tokens": {"bogus": np.zeros(3)}}, "unknown token column"),
    ({"tokens": {"task": "oob"}}, "token column 'task' holds 5"),
    ({"logits_TLE": "wrong"}, "logits_TLE has shape"),
])
def test_append_rejects_bad_rows(tmp_path, small_trace, kwargs, match):
    t = small_trace()
    args = {"tokens": {}, "experts_TLK": t.experts_TLK, "weights_TLK": t.weights_TLK}
    bad = {"bad_ids": np.where(t.experts_TLK == 0, 99, t.experts_TLK).astype(np.int32),
           "float": t.experts_TLK.astype(np.float32), "nan": np.full_like(t.weights_TLK, np.nan),
           "oob": np.full(t.num_tokens, 5), "wrong": np.zeros((t.num_tokens, 3, 7), np.float32)}
    for k, v in kwargs.items():
        args[k] = {c: bad[x] if isinstance(x, str) else x for c, x in v.items()} if k == "tokens" else bad[v]
    with TraceWriter(tmp_path / "x", t.spec, task_names=t.task_names) as w:
        with pytest.raises(TraceError, match=match):
            w.append(**args)


def test_writer_refuses_layout_change_closed_writer_and_bad_arguments(tmp_path, small_trace):
    t = small_trace(logits=True)
    w = TraceWriter(tmp_path / "l", t.spec)
    w.append({}, t.experts_TLK, t.weights_TLK, t.logits_TLE)
    with pytest.raises(TraceError, match="tensor 'logits_TLE' is absent; expected present"):
        w.append({}, t.experts_TLK, t.weights_TLK)
    w.close()
    assert w.close() == tmp_path / "l"  # idempotent
    with pytest.raises(TraceError, match="is closed"):
        w.append({}, t.experts_TLK, t.weights_TLK)
    with pytest.raises(ConfigError, match="shard_tokens is 0"):
        TraceWriter(tmp_path / "z", t.spec, shard_tokens=0)
    with pytest.raises(TraceError, match="provenance cannot be stored as JSON"):
        TraceWriter(tmp_path / "z", t.spec, provenance={"f": object()})
    (tmp_path / "file").write_text("x")
    with pytest.raises(TraceError, match="is not a directory"):
        TraceWriter(tmp_path / "file", t.spec)


def test_second_writer_on_same_directory_is_refused(tmp_path, small_trace):
    t = small_trace()
    w = TraceWriter(tmp_path / "busy", t.spec)
    with pytest.raises(TraceError, match="another TraceWriter"):
        TraceWriter(tmp_path / "busy", t.spec, resume=True)
    w.close()


def test_existing_trace_needs_overwrite_and_survives_a_failed_one(tmp_path, small_trace, assert_trace_equal):
    old, new = small_trace(seed=1), small_trace(2, seed=2)
    write_trace(old, tmp_path / "t", shard_tokens=5)
    with pytest.raises(TraceError, match="exists and is not empty"):
        write_trace(new, tmp_path / "t")
    with pytest.raises(RuntimeError), TraceWriter(tmp_path / "t", new.spec, overwrite=True) as w:
        w.append({}, new.experts_TLK, new.weights_TLK)
        w.flush()
        raise RuntimeError("capture crashed")
    assert_trace_equal(read_trace(tmp_path / "t"), old)  # untouched until a new trace is complete
    write_trace(new, tmp_path / "t", overwrite=True)
    assert_trace_equal(read_trace(tmp_path / "t"), new)
    names = sorted(p.name for p in (tmp_path / "t").iterdir())
    assert names == ["routing-00000.safetensors", "tokens.parquet", "trace.json"]
    assert not (tmp_path / ".t.partial").exists()


def test_overwrite_without_renameat2_uses_two_renames(tmp_path, small_trace, assert_trace_equal, monkeypatch):
    monkeypatch.setattr(trace_shards, "_exchange", lambda a, b: False)
    write_trace(small_trace(seed=1), tmp_path / "t")
    new = small_trace(seed=3)
    write_trace(new, tmp_path / "t", overwrite=True)
    assert_trace_equal(read_trace(tmp_path / "t"), new)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_read_shard_and_inspect(tmp_path, small_trace, assert_trace_equal):
    t = small_trace(logits=True)
    write_trace(t, tmp_path / "t", shard_tokens=16)
    assert_trace_equal(read_shard(tmp_path / "t" / "routing-00001.safetensors"), t.select(np.arange(16, 32)),
                       check_provenance=False)
    info = inspect_trace(tmp_path / "t")
    assert info["valid"] and info["state"] == "finished" and info["num_tokens"] == 40
    assert info["tokens_by_phase"] == {"prefill": 24, "decode": 16}
    assert info["tokens_by_task"] == {"qa": 20, "code": 20} and info["num_requests"] == 4
    assert [s["rows"] for s in info["shards"]] == [16, 16, 8] and info["tensors"]["logits_TLE"] is True
    json.dumps(info)  # the CLI prints it as JSON
    (tmp_path / "t" / "trace.json").write_text("{")
    bad = inspect_trace(tmp_path / "t")
    assert not bad["valid"] and "trace.json" in bad["error"]
    assert inspect_trace(tmp_path / "nope")["state"] == "missing"


def test_inspect_unfinished_trace(tmp_path, small_trace):
    t = small_trace()
    w = TraceWriter(tmp_path / "u", t.spec, task_names=t.task_names, source_names=t.source_names)
    w.append(t.tokens, t.experts_TLK, t.weights_TLK)
    w.flush()
    info = inspect_trace(tmp_path / "u")
    assert info["state"] == "unfinished" and not info["valid"] and info["num_tokens"] == t.num_tokens
    assert "never finished" in info["error"] and info["shards"][0]["rows"] == t.num_tokens
    with pytest.raises(TraceError, match="never finished"):
        read_trace(tmp_path / "u")
    w.close()


# ---------------------------------------------------------------- one test per validation error
def _rewrite_shard(f: Path, **changes) -> None:
    """Rewrite a shard with some tensors replaced (array) or removed (None); header metadata kept."""
    with safe_open(str(f), framework="numpy") as h:
        meta = h.metadata()
    arrays = load_file(str(f))
    for k, v in changes.items():
        if v is None:
            arrays.pop(k)
        else:
            arrays[k] = v(arrays.get(k)) if callable(v) else v
    save_file(arrays, str(f), metadata=meta)


def _rewrite_tokens(f: Path, fn) -> None:
    pq.write_table(fn(pq.read_table(f)), f)


def _edit_json(f: Path, fn) -> None:
    m = json.loads(f.read_text())
    fn(m)
    f.write_text(json.dumps(m))


def _set_col(name: str, values):
    def fn(table: pa.Table) -> pa.Table:
        i = table.column_names.index(name)
        return table.set_column(i, name, pa.array(values(table.column(name).to_numpy())))
    return fn


def _where(cond, value):
    """A tensor edit: set the entries where cond holds to value, keeping the dtype."""
    return lambda a: np.where(cond(a), value, a).astype(a.dtype)


S0, S1 = "routing-00000.safetensors", "routing-00001.safetensors"
CASES = {
    "missing trace.json": (lambda d: (d / "trace.json").unlink(), ["trace.json", "missing"]),
    "bad json": (lambda d: (d / "trace.json").write_text('{"schema_version": 1,'),
                 ["trace.json", "not valid JSON"]),
    "schema version": (lambda d: _edit_json(d / "trace.json", lambda m: m.update(schema_version=99)),
                       ["trace.json", "'schema_version' is 99"]),
    "spec error": (lambda d: _edit_json(d / "trace.json", lambda m: m["spec"].update(top_k=9)),
                   ["trace.json", "field 'spec'", "top_k"]),
    "spec unknown field": (lambda d: _edit_json(d / "trace.json", lambda m: m["spec"].update(colour=1)),
                           ["trace.json", "colour"]),
    "shard list": (lambda d: _edit_json(d / "trace.json", lambda m: m["shards"][0].update(file="../x")),
                   ["trace.json", "'shards'"]),
    "num_tokens": (lambda d: _edit_json(d / "trace.json", lambda m: m.update(num_tokens=41)),
                   ["trace.json", "'shards' holds 40 rows"]),
    "missing parquet": (lambda d: (d / "tokens.parquet").unlink(), ["tokens.parquet", "missing"]),
    "parquet garbage": (lambda d: (d / "tokens.parquet").write_bytes(b"PAR1" + b"\0" * 50), ["tokens.parquet",
                                                                                              "Parquet"]),
    "column dtype": (lambda d: _rewrite_tokens(d / "tokens.parquet",
                                               _set_col("position", lambda a: a.astype(np.int64))),
                     ["tokens.parquet", "'position'", "int64", "expected int32"]),
    "column struct": (lambda d: _rewrite_tokens(d / "tokens.parquet", lambda t: t.set_column(
        1, "position", pa.array([{"a": i} for i in range(40)], pa.struct([("a", pa.int32())])))),
        ["tokens.parquet", "'position'", "struct<a: int32>", "expected int32"]),
    "column length": (lambda d: _rewrite_tokens(d / "tokens.parquet", lambda t: t.slice(0, 39)),
                      ["tokens.parquet", "39 rows", "num_tokens = 40"]),
    "column missing": (lambda d: _rewrite_tokens(d / "tokens.parquet", lambda t: t.drop_columns(["step"])),
                       ["tokens.parquet", "columns are"]),
    "column nulls": (lambda d: _rewrite_tokens(d / "tokens.parquet", lambda t: t.set_column(
        1, "position", pa.array([None] + list(range(39)), pa.int32()))),
        ["tokens.parquet", "'position'", "null"]),
    "task range": (lambda d: _rewrite_tokens(d / "tokens.parquet", _set_col("task", lambda a: a + 3)),
                   ["tokens.parquet", "'task' holds 4"]),
    "phase range": (lambda d: _rewrite_tokens(d / "tokens.parquet", _set_col("phase", lambda a: a * 3)),
                    ["tokens.parquet", "'phase' holds 3"]),
    "missing shard": (lambda d: (d / S1).unlink(), [S1, "cannot be read"]),
    "shard rows": (lambda d: _rewrite_shard(d / S1, experts_TLK=lambda a: a[:-1]),
                   [S1, "'experts_TLK' has shape (15, 3, 2)", "expected (16, 3, 2)"]),
    "shard dtype": (lambda d: _rewrite_shard(d / S0, experts_TLK=lambda a: a.astype(np.int32)),
                    [S0, "'experts_TLK' has dtype int32", "int16"]),
    "shard tensor missing": (lambda d: _rewrite_shard(d / S0, weights_TLK=None),
                             [S0, "'weights_TLK' is missing"]),
    "shard extra tensor": (lambda d: _rewrite_shard(d / S0, extra=np.zeros(2)),
                           [S0, "unexpected tensor 'extra'"]),
    "shard layout": (lambda d: _rewrite_shard(d / S0, logits_TLE=None), [S0, "'logits_TLE'", "tensors"]),
    "shard token column": (lambda d: _rewrite_shard(d / S0, **{"token.step": lambda a: a.astype(np.int32)}),
                           [S0, "'token.step' has dtype int32"]),
    "truncated shard": (lambda d: (d / S1).write_bytes((d / S1).read_bytes()[:-10]), [S1, "truncated"]),
    "short shard": (lambda d: (d / S1).write_bytes(b"\x05"), [S1, "header length"]),
    "shard header json": (lambda d: (d / S1).write_bytes((8).to_bytes(8, "little") + b"{nope!!}"),
                          [S1, "not valid JSON"]),
    "shard replaced": (lambda d: _edit_json(d / "trace.json", lambda m: m["shards"][1].update(bytes=7)),
                       [S1, "expected 7"]),
    "expert too large": (lambda d: _rewrite_shard(d / S1, experts_TLK=_where(lambda a: a == 3, 99)),
                         [S1, "experts_TLK holds expert id 99"]),
    "expert below -1": (lambda d: _rewrite_shard(d / S0, experts_TLK=_where(lambda a: a == 3, -2)),
                        [S0, "experts_TLK holds expert id -2"]),
    "nan weights": (lambda d: _rewrite_shard(d / S0, weights_TLK=_where(lambda a: a > 0.5, np.nan)),
                    [S0, "weights_TLK holds NaN"]),
    "inf logits": (lambda d: _rewrite_shard(d / S1, logits_TLE=_where(lambda a: a > 1, np.inf)),
                   [S1, "logits_TLE holds NaN or inf"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_validation_error_names_file_and_field(tmp_path, small_trace, case):
    damage, needles = CASES[case]
    d = tmp_path / "t"
    write_trace(small_trace(logits=True), d, shard_tokens=16)
    damage(d)
    with pytest.raises(TraceError) as ei:
        verify_trace(read_trace(d))  # a multi-shard trace checks each shard's values when first mapped
    msg = str(ei.value)
    for n in needles:
        assert n in msg, (n, msg)
    assert msg.count(". ") == 0 or msg.endswith("."), msg  # one sentence
    assert not inspect_trace(d)["valid"]


def test_missing_directory_and_interrupted_overwrite_hint(tmp_path):
    with pytest.raises(TraceError, match="does not exist; expected a directory"):
        read_trace(tmp_path / "absent")
    (tmp_path / ".gone.old").mkdir()
    with pytest.raises(TraceError, match=r"previous trace in .*\.gone\.old"):
        read_trace(tmp_path / "gone")
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(TraceError, match="is a file, not a trace directory"):
        read_trace(tmp_path / "f.txt")


def test_columns_follow_trace_dtypes(tmp_path, small_trace):
    write_trace(small_trace(), tmp_path / "t")
    schema = pq.read_schema(tmp_path / "t" / "tokens.parquet")
    assert {f.name: np.dtype(f.type.to_pandas_dtype()) for f in schema} == COLUMNS


def test_read_refuses_a_shard_that_trace_json_does_not_list(tmp_path, small_trace):
    import shutil

    write_trace(small_trace(), tmp_path / "t", shard_tokens=8)
    shutil.copy(tmp_path / "t" / "routing-00000.safetensors", tmp_path / "t" / "routing-00007.safetensors")
    with pytest.raises(TraceError, match="routing-00007.safetensors: routing shard not listed in trace.json"):
        read_trace(tmp_path / "t")
    assert not inspect_trace(tmp_path / "t")["valid"]
