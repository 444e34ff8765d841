"""Trace invariants and import range checks, through the CLI: exit 2, one sentence on stderr, no traceback.

Each invariant is either an error (refused on construction, write and read) or a documented allowance
(accepted); see the module docstring of routecast/trace/trace.py. Bad traces are written with validation
switched off, so the read path (`routecast stats`, `predict eval`) is what refuses them.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from routecast.cli import main
from routecast.common.errors import TraceError
from routecast.trace import MoESpec, Trace
from routecast.trace.checks import check_finite, check_ids_and_weights
from routecast.trace.io import TRACE_JSON, write_trace
from tests.conftest import build_small_trace


def _one_sentence_exit_2(capsys, argv: list[str], pattern: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert pattern in err, err
    return err


def _fields(trace: Trace) -> dict:
    return dict(spec=trace.spec, tokens={k: v.copy() for k, v in trace.tokens.items()},
                experts_TLK=trace.experts_TLK.copy(), weights_TLK=trace.weights_TLK.copy(),
                logits_TLE=trace.logits_TLE, hidden_TLH=trace.hidden_TLH, task_names=trace.task_names,
                source_names=trace.source_names, provenance=trace.provenance)


def _write_unchecked(fields: dict, path: Path, monkeypatch) -> Path:
    """Write a trace that breaks an invariant: the writer's own validation is switched off meanwhile."""
    with monkeypatch.context() as m:
        m.setattr(Trace, "validate", lambda self, where="trace": None)
        return write_trace(Trace(**fields), path)


def _rows_of_request(f: dict, r: int) -> np.ndarray:
    return np.flatnonzero(f["tokens"]["request"] == r)


def _set(name: str, value):
    def mutate(f: dict) -> None:
        f["tokens"][name][3] = value
    return mutate


def _swap_steps(f: dict) -> None:  # request 0's first decode token now runs before its prompt
    rows = _rows_of_request(f, 0)
    f["tokens"]["step"][rows[-1]], f["tokens"]["step"][rows[0]] = 0, f["tokens"]["step"][rows[-1]]


def _dup_position(f: dict) -> None:
    rows = _rows_of_request(f, 1)
    f["tokens"]["position"][rows[2]] = f["tokens"]["position"][rows[1]]


def _dup_expert(f: dict) -> None:
    f["experts_TLK"][5, 1, 1] = f["experts_TLK"][5, 1, 0]


def _weight(v: float):
    def mutate(f: dict) -> None:
        f["weights_TLK"][7, 2, 0] = v
    return mutate


def _nan_hidden(f: dict) -> None:
    h = f["hidden_TLH"].copy()
    h[9, 0, 3] = np.nan
    f["hidden_TLH"] = h


# invariant -> (mutation of a valid trace's fields, what the one sentence must say)
ERRORS = {
    "negative request": (_set("request", -1), "token column 'request' holds -1 (row 3); expected >= 0"),
    "negative position": (_set("position", -5), "token column 'position' holds -5 (row 3); expected >= 0"),
    "negative step": (_set("step", -2), "token column 'step' holds -2 (row 3); expected >= 0"),
    "token id below -1": (_set("token_id", -7), "token column 'token_id' holds -7 (row 3); expected >= -1"),
    "steps out of order": (_swap_steps, "expected steps that never decrease along a request's positions"),
    "position twice": (_dup_position, "has two tokens at position"),
    "expert twice in top-k": (_dup_expert, "expected distinct experts in a token's top-k"),
    "negative weight": (_weight(-0.25), "weights_TLK holds -0.25 (token row 7, layer 2)"),
    "NaN weight": (_weight(np.nan), "weights_TLK holds NaN (token row 7, layer 2)"),
    "inf weight": (_weight(np.inf), "weights_TLK holds inf"),
    "NaN hidden state": (_nan_hidden, "hidden_TLH holds NaN or inf (token row 9)"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_broken_invariant_is_refused_on_read_with_one_sentence(tmp_path, monkeypatch, capsys, case):
    mutate, pattern = ERRORS[case]
    fields = _fields(build_small_trace(num_requests=4, hidden=8))
    mutate(fields)
    with pytest.raises(TraceError, match=pattern.split(" (")[0]):
        Trace(**fields)  # refused in memory too (and so by TraceWriter.append, which validates every row)
    path = _write_unchecked(fields, tmp_path / "t", monkeypatch)
    # stats never reads hidden_TLH; the lookahead predictor does (its read fails before any fitting)
    argv = ["predict", "eval", str(path), "--predictors", "lookahead"] if "hidden" in case else ["stats", str(path)]
    err = _one_sentence_exit_2(capsys, argv, pattern)
    assert str(path) in err


SPEC_ERRORS = {
    "duplicate layer_ids": ({"layer_ids": [0, 2, 2]}, "layer_ids holds 2 twice"),
    "non-integer layer_ids": ({"layer_ids": [0, 1.5, 3]}, "layer_ids holds 1.5; expected integer"),
    "string layer_ids": ({"layer_ids": [0, "one", 3]}, "layer_ids holds 'one'; expected integer"),
    "negative layer_ids": ({"layer_ids": [-1, 0, 1]}, "layer_ids holds -1 below 0"),
    "absurd num_experts": ({"num_experts": 10**12}, "num_experts is 1000000000000; expected at most 32768"),
    "absurd num_layers": ({"num_layers": 10**9, "layer_ids": []}, "num_layers x num_experts is 1000000000 x 8"),
}


@pytest.mark.parametrize("case", list(SPEC_ERRORS))
@pytest.mark.parametrize("cmd", [["stats"], ["predict", "eval", "--predictors", "distribution"]])
def test_bad_spec_in_trace_json_is_one_sentence(tmp_path, capsys, case, cmd):
    path = write_trace(build_small_trace(num_requests=4), tmp_path / "t")
    meta = json.loads((path / TRACE_JSON).read_text())
    meta["spec"].update(SPEC_ERRORS[case][0])
    (path / TRACE_JSON).write_text(json.dumps(meta))
    argv = [cmd[0], *([cmd[1]] if len(cmd) > 1 else []), str(path), *cmd[2:]]
    _one_sentence_exit_2(capsys, argv, SPEC_ERRORS[case][1])


@pytest.mark.parametrize("knobs,pattern", [
    (["num_experts=1000000000000"], "num_experts is 1000000000000; expected at most 32768"),
    (["num_layers=4000000"], "num_layers x num_experts is 4000000 x 8"),
    (["num_layers=2", "layer_ids=3,3"], "layer_ids holds 3 twice"),
])
def test_synth_refuses_an_absurd_geometry_before_allocating(tmp_path, capsys, knobs, pattern):
    argv = ["synth", "--preset", "mixtral-8x7b", "--tokens", "100", "--out", str(tmp_path / "s")]
    _one_sentence_exit_2(capsys, argv + [x for k in knobs for x in ("--set", k)], pattern)
    assert not (tmp_path / "s").exists()


def test_documented_allowances_are_accepted(tmp_path, capsys):
    """Rows out of step order, weights not summing to 1, -1 repeated in a top-k: accepted as documented."""
    tr = build_small_trace(num_requests=5, dropped=0.3)
    assert (tr.experts_TLK == -1).sum(-1).max() >= 2  # some token has two dropped slots
    f = _fields(tr)
    f["weights_TLK"] *= 2.5  # DeepSeek-V3 scales its top-k weights by routed_scaling_factor
    o = np.random.default_rng(0).permutation(tr.num_tokens)  # rows in no particular order
    f["tokens"] = {k: v[o] for k, v in f["tokens"].items()}
    f["experts_TLK"], f["weights_TLK"] = f["experts_TLK"][o], f["weights_TLK"][o]
    path = write_trace(Trace(**f), tmp_path / "t")
    assert main(["stats", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["overall"]


def test_routing_checks_scan_in_chunks_and_find_a_late_defect(monkeypatch):
    """Chunking must not hide a defect in a later chunk (memory-mapped shards are scanned piece by piece)."""
    import routecast.trace.checks as checks

    monkeypatch.setattr(checks, "_CHUNK_SLOTS", 64)  # 64 values = 5 tokens per chunk at L=3, K=4
    rng = np.random.default_rng(0)
    e = np.argsort(rng.random((50, 3, 16)), axis=-1)[..., :4].astype(np.int16)
    w = np.full(e.shape, 0.25, np.float32)
    check_ids_and_weights(e, w, 16, "x")
    e[47, 2, 3] = e[47, 2, 0]
    with pytest.raises(TraceError, match=r"token row 47, layer 2"):
        check_ids_and_weights(e, w, 16, "x")
    h = rng.standard_normal((50, 3, 8)).astype(np.float16)
    check_finite(h, "hidden_TLH", "x", "finite")
    h[41, 1, 5] = -np.inf
    with pytest.raises(TraceError, match=r"token row 41"):
        check_finite(h, "hidden_TLH", "x", "finite")


@pytest.mark.parametrize("offset", [0, 70_000, 2**40])  # uint16 radix path, int64 key path, lexsort path
@pytest.mark.parametrize("shuffle", [False, True])
def test_request_order_check_on_every_sort_path(offset, shuffle):
    from routecast.trace.checks import check_request_order

    tr = build_small_trace(num_requests=5)
    o = np.random.default_rng(1).permutation(tr.num_tokens) if shuffle else np.arange(tr.num_tokens)
    req, pos, step = tr.request[o] + offset, tr.position[o].copy(), tr.step[o].copy()
    check_request_order(req, pos, step, "x")
    late = int(np.flatnonzero((req == offset + 2) & (pos == 7))[0])  # a decode token of request 2
    step[late] = 0
    with pytest.raises(TraceError, match=f"request {offset + 2} has position 7 in step 0 but the earlier position 6"):
        check_request_order(req, pos, step, "x")
    pos[late] = 6
    with pytest.raises(TraceError, match=f"request {offset + 2} has two tokens at position 6"):
        check_request_order(req, pos, step, "x")


# ---------------------------------------------------------------------------------------------- import
def _log(path: Path, **override) -> Path:
    """Four records (2 tokens x 2 layers); the first record takes override, the others its extra fields."""
    recs = [dict(request=0, layer=lay, position=p, experts=[0, 1], weights=[0.6, 0.4]) for p in range(2)
            for lay in range(2)]
    for r in recs[1:]:
        r.update({k: p for k, p in (("step", r["position"]), ("token_id", 5)) if k in override})
    recs[0].update(override)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


IMPORT_ERRORS = {
    "id wraps int16": ({"experts": [65539, 1]}, "field 'experts' is [65539, 1]; expected ids in -1..32767"),
    "id 2**40": ({"experts": [2**40, 1]}, "field 'experts' is [1099511627776, 1]; expected ids in -1..32767"),
    "id beyond int64": ({"experts": [2**70, 1]}, "expected ids in -1..32767"),
    "request beyond int64": ({"request": 2**70}, "field 'request' is 1180591620717411303424; expected 0..2**63-1"),
    "negative request": ({"request": -3}, "field 'request' is -3; expected 0..2**63-1"),
    "position beyond int64": ({"position": 2**64}, "field 'position' is 18446744073709551616; expected 0..2**31-1"),
    "step beyond int64": ({"step": 2**63}, "field 'step' is 9223372036854775808; expected 0..2**63-1"),
    "expert twice": ({"experts": [1, 1]}, "field 'experts' is [1, 1]; expected distinct ids"),
    "negative weight": ({"weights": [-0.5, 0.4]}, "field 'weights' is [-0.5, 0.4]; expected finite, non-negative"),
    "weight beyond float32": ({"weights": [1e39, 0.4]}, "field 'weights' is [1e+39, 0.4]; expected finite, "
                              "non-negative numbers up to 3.4e38 (float32)"),
    "weight int beyond float64": ({"weights": [2**1100, 0.4]}, "expected a list of numbers within +-2**63"),
    "token id beyond int64": ({"token_id": 2**70}, "field 'token_id' is 1180591620717411303424; expected -1..2**31-1"),
}


@pytest.mark.parametrize("case", list(IMPORT_ERRORS))
def test_import_refuses_out_of_range_values_naming_file_line_field_and_range(tmp_path, capsys, case):
    override, pattern = IMPORT_ERRORS[case]
    src = _log(tmp_path / "log.jsonl", **override)
    err = _one_sentence_exit_2(capsys, ["import", str(src), "--out", str(tmp_path / "o"), "--quiet"], pattern)
    assert f"{src} line 1:" in err
    assert not (tmp_path / "o").exists()


def test_import_refuses_id_beyond_the_given_num_experts(tmp_path, capsys):
    src = _log(tmp_path / "log.jsonl", experts=[9, 1])
    _one_sentence_exit_2(capsys, ["import", str(src), "--out", str(tmp_path / "o"), "--quiet", "--num-experts", "8"],
                         "line 1: field 'experts' is [9, 1]; expected ids in -1..7")


def test_import_refuses_an_absurd_num_experts_before_reading(tmp_path, capsys):
    src = _log(tmp_path / "log.jsonl")
    _one_sentence_exit_2(capsys, ["import", str(src), "--out", str(tmp_path / "o"), "--num-experts", str(10**12)],
                         "--num-experts is 1000000000000; expected an integer in [1, 32768]")


def _gz_variants(tmp_path: Path) -> dict[str, Path]:
    plain = _log(tmp_path / "ok.jsonl").read_bytes() * 200
    gz = gzip.compress(plain)
    out = {"truncated": gz[: len(gz) // 2], "not gzip": b"\x1f\x8b" + b"not a gzip stream" * 8,
           "bad crc": gz[:-8] + bytes(8), "cut in the header": gz[:5]}
    paths = {}
    for name, data in out.items():
        paths[name] = tmp_path / f"{name.replace(' ', '_')}.jsonl.gz"
        paths[name].write_bytes(data)
    return paths


@pytest.mark.parametrize("case", ["truncated", "not gzip", "bad crc", "cut in the header"])
def test_damaged_gzip_is_one_sentence(tmp_path, capsys, case):
    src = _gz_variants(tmp_path)[case]
    err = _one_sentence_exit_2(capsys, ["import", str(src), "--out", str(tmp_path / "o"), "--quiet"],
                               "is not a complete gzip file")
    assert str(src) in err and not (tmp_path / "o").exists()


def test_spec_limits_in_python():
    with pytest.raises(TraceError, match="expected at most 32768"):
        MoESpec(num_layers=1, num_experts=40000, top_k=2)
    assert MoESpec(num_layers=2, num_experts=32768, top_k=8, layer_ids=(np.int64(3), 7)).layer_ids == (3, 7)
