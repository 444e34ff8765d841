"""Routing values are checked on every shard's first read whatever its CRC-32 says (issue 20).

A shard is tampered in place and trace.json's checksum updated to match (tests/fuzz/tamper.py), so only
the value checks can catch it: readers, `routecast inspect` and the commands that consume a trace must
refuse it with one sentence naming the shard file.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from routecast.cli import main
from routecast.common.errors import TraceError
from routecast.trace.io import read_trace, verify_trace, write_trace
from routecast.trace.summary import inspect_trace
from tests.conftest import build_small_trace
from tests.fuzz.tamper import duplicate_first, set_value, tamper_shard

E = 8
KINDS = {  # kind -> (tensor, value or None for a duplicate, the phrase the reader's sentence holds)
    "out-of-range": ("experts_TLK", None, "expert id"),
    "duplicate": ("experts_TLK", None, "twice for one token"),
    "non-finite": ("weights_TLK", float("nan"), "NaN"),
}


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tv") / "t"
    tr = build_small_trace(num_requests=6, prompt_len=5, decode_len=4, num_experts=E, logits=True)
    write_trace(tr, d, shard_tokens=12)  # 54 rows in 5 shards: the multi-shard (lazy) path
    return d


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["out-of-range", "duplicate", "non-finite"]), shard=st.integers(0, 4),
       row=st.integers(0, 5), layer=st.integers(0, 2),
       bad_id=st.sampled_from([E, E + 1, 32767, -2, -7, -32768]),
       bad_w=st.sampled_from([float("nan"), float("inf"), float("-inf")]))
def test_a_tampered_shard_with_a_matching_crc_is_refused(trace_dir, tmp_path_factory, kind, shard, row, layer,
                                                         bad_id, bad_w):
    d = _copy(trace_dir, tmp_path_factory.mktemp("c") / "t")
    tensor = KINDS[kind][0]
    edit = (duplicate_first(row, layer) if kind == "duplicate" else
            set_value(row, layer, 0, bad_id if kind == "out-of-range" else bad_w))
    f = tamper_shard(d, shard, tensor, edit)
    for verify in (True, False):
        for mmap in (True, False):
            with pytest.raises(TraceError) as e:
                verify_trace(read_trace(d, verify=verify, mmap=mmap))
            msg = str(e.value)
            assert f.name in msg and "\n" not in msg
            assert "token row" in msg and "CRC" not in msg  # the value, not the checksum, is named
    info = inspect_trace(d)
    assert not info["valid"]
    (p,) = [q for q in info["problems"] if q["kind"] == kind]
    assert p["file"] == str(f) and p["first_row"] == row and p["layer"] == layer
    assert {q["file"] for q in info["problems"]} == {str(f)}


def test_inspect_reports_every_kind_with_file_and_row(trace_dir, tmp_path, capsys):
    d = _copy(trace_dir, tmp_path / "t")
    tamper_shard(d, 1, "experts_TLK", set_value(2, 1, 0, 64))
    tamper_shard(d, 1, "experts_TLK", duplicate_first(4, 0))
    tamper_shard(d, 3, "weights_TLK", set_value(0, 2, 1, float("nan")))
    tamper_shard(d, 4, "logits_TLE", set_value(1, 0, 3, float("inf")))
    assert main(["inspect", str(d)]) == 2
    out, err = capsys.readouterr()
    lines = [ln for ln in out.splitlines() if "problem:" in ln]
    assert len(lines) == 4, out
    assert "routing-00001.safetensors: out-of-range experts_TLK in 1 row(s), first at token row 2 layer 1" in out
    assert "routing-00001.safetensors: duplicate experts_TLK in 1 row(s), first at token row 4 layer 0" in out
    assert "routing-00003.safetensors: non-finite weights_TLK in 1 row(s), first at token row 0 layer 2" in out
    assert "routing-00004.safetensors: non-finite logits_TLE" in out
    assert err.count("\n") == 1 and "routing-00001.safetensors" in err
    assert main(["inspect", str(d), "--json"]) == 2
    js = json.loads(capsys.readouterr().out)
    assert sorted(q["kind"] for q in js["problems"]) == ["duplicate", "non-finite", "non-finite", "out-of-range"]


@pytest.mark.parametrize("kind", ["out-of-range", "duplicate", "non-finite"])
@pytest.mark.parametrize("argv", [
    ["cache", "replay", "{T}", "--policies", "lru", "--expert-bytes", "1000", "--out", "{O}/r.json", "--quiet"],
    ["serve-sim", "--trace", "{T}", "--requests", "20", "--out", "{O}/s.json", "--quiet"],
    ["schedule", "cocluster", "{T}", "--ep", "2", "--out", "{O}/c.json", "--quiet"],
], ids=["cache-replay", "serve-sim", "cocluster"])
def test_commands_refuse_a_tampered_trace_in_one_sentence(trace_dir, tmp_path, capsys, kind, argv):
    d = _copy(trace_dir, tmp_path / "t")
    tensor, value, phrase = KINDS[kind]
    edit = duplicate_first(3, 2) if kind == "duplicate" else set_value(3, 2, 0, E if value is None else value)
    f = tamper_shard(d, 2, tensor, edit)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    out = tmp_path / "o"
    out.mkdir()
    rc = main([a.replace("{T}", str(d)).replace("{O}", str(out)) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and f.name in err and phrase in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
    assert not any(out.iterdir())


def test_the_value_checks_cost_little_next_to_the_checksum(trace_dir):
    # Not a timing test: the checks visit each shard once (a second scan re-checks nothing).
    tr = read_trace(trace_dir)
    src = tr.experts_TLK.source
    assert verify_trace(tr) == 5 and src.checked == set(range(5))
    assert np.asarray(tr.experts_TLK).shape == (54, 3, 2)
