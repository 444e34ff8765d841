"""import_jsonl: JSON-lines routing logs -> Trace, streaming, with one-sentence errors naming the line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from routecast.common.errors import ConfigError, TraceError
from routecast.trace import importers
from routecast.trace.importers import import_jsonl
from routecast.trace.io import read_trace
from routecast.trace.spec import MoESpec
from routecast.trace.trace import PHASES, Trace

LOG_NAMES = {"request": "request", "layer": "layer", "position": "token_idx", "token_id": "token_id",
             "experts": "experts", "weights": "gating_probs", "phase": "phase", "step": "step",
             "task": "task", "source": "source", "arrival_s": "arrival_s", "document": "doc_id"}


def _records(t: Trace, *, order: str = "forward", names: dict[str, str] | None = None,
             drop: tuple[str, ...] = (), layer_ids: tuple[int, ...] | None = None) -> list[dict]:
    """The log a forward hook would write: per step, per layer, per token of the step (order="forward"),
    or each token's layers together (order="token")."""
    names = {**LOG_NAMES, **(names or {})}
    lids = layer_ids or tuple(range(t.spec.num_layers))
    if order == "forward":
        slots = [(i, layer) for _, idx in t.batches() for layer in range(t.spec.num_layers) for i in idx]
    else:
        slots = [(i, layer) for i in range(t.num_tokens) for layer in range(t.spec.num_layers)]
    recs = []
    for i, layer in slots:
        rec = {"request": int(t.request[i]), "layer": lids[layer], "position": int(t.position[i]),
               "token_id": int(t.token_id[i]), "experts": t.experts_TLK[i, layer].tolist(),
               "weights": t.weights_TLK[i, layer].tolist(), "phase": PHASES[t.phase[i]],
               "step": int(t.step[i]),
               "task": t.task_names[t.task[i]], "source": t.source_names[t.source[i]],
               "arrival_s": float(t.arrival_s[i]), "document": int(t.document[i])}
        recs.append({names[k]: v for k, v in rec.items() if k not in drop})
    return recs


def _write(path: Path, recs: list[dict], *, gz: bool = False, blank_every: int = 0) -> Path:
    lines = [json.dumps(r) for r in recs]
    if blank_every:
        lines = [x for i, line in enumerate(lines) for x in ((line, "") if i % blank_every == 0 else (line,))]
    text = "\n".join(lines) + "\n"
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize(("order", "gz", "block"), [("forward", False, None), ("token", True, None),
                                                    ("forward", False, 4096)])
def test_round_trip_with_every_field(tmp_path, small_trace, assert_trace_equal, monkeypatch, order, gz,
                                     block):
    if block:  # many small JSON blocks: tokens complete across block boundaries
        monkeypatch.setattr(importers, "_BLOCK", block)
    t = small_trace(6, dropped=0.1, seed=4)
    src = _write(tmp_path / ("log.jsonl.gz" if gz else "log.jsonl"), _records(t, order=order), gz=gz)
    got = read_trace(import_jsonl(src, tmp_path / "out", spec=t.spec, progress=False))
    assert_trace_equal(got, t, check_provenance=False)
    assert got.provenance["records"] == t.num_tokens * 3 and got.provenance["step"] == "from the log"


def test_plain_log_named_gz_is_read_and_the_note_says_so(tmp_path, small_trace, assert_trace_equal, capsys):
    t = small_trace(4, dropped=0.0, seed=3)
    src = _write(tmp_path / "log.jsonl.gz", _records(t), gz=False)  # plain text under a .gz name
    got = read_trace(import_jsonl(src, tmp_path / "out", spec=t.spec, progress=False))
    assert_trace_equal(got, t, check_provenance=False)
    err = capsys.readouterr().err
    assert "is not gzip-compressed; read as plain JSON lines" in err and str(src) in err
    import_jsonl(_write(tmp_path / "real.jsonl.gz", _records(t), gz=True), tmp_path / "out2", spec=t.spec,
                 progress=False)
    assert "gzip" not in capsys.readouterr().err  # a real gzip file says nothing


def test_inference_aliases_and_derived_steps(tmp_path, small_trace):
    t = small_trace(dropped=0.0, seed=2)
    src = _write(tmp_path / "log.jsonl", _records(t, drop=("step", "task", "source", "arrival_s", "phase", "document"),
                                                  layer_ids=(3, 7, 11)), blank_every=5)
    got = read_trace(import_jsonl(src, tmp_path / "out", progress=False))
    assert (got.document == -1).all() and got.provenance["document"].startswith("absent")
    s = got.spec
    assert (s.num_layers, s.top_k, s.layer_ids) == (3, 2, (3, 7, 11))
    assert s.num_experts == int(t.experts_TLK.max()) + 1
    np.testing.assert_array_equal(got.experts_TLK, t.experts_TLK)
    assert (got.phase == 0).all() and got.task_names == () and (got.task == -1).all()
    # no phase: everything is prefill, so each run of one request's consecutive tokens is one step
    runs = np.r_[True, got.request[1:] != got.request[:-1]]
    np.testing.assert_array_equal(got.step, np.cumsum(runs) - 1)
    assert got.provenance["fields"]["position"] == "token_idx"
    assert got.provenance["fields"]["weights"] == "gating_probs"


def test_derived_steps_with_phase(tmp_path, small_trace):
    t = small_trace(3, prompt_len=4, decode_len=2)
    got = read_trace(import_jsonl(_write(tmp_path / "l.jsonl", _records(t, drop=("step",))), tmp_path / "o",
                                  spec=t.spec, progress=False))
    n_prefill_steps, n_decode = 3, int((t.phase == 1).sum())
    assert np.unique(got.step).size == n_prefill_steps + n_decode
    assert all(np.unique(got.step[idx[got.phase[idx] == 0]]).size == 1 for _, idx in got.requests())
    np.testing.assert_array_equal(got.experts_TLK, t.experts_TLK)


def test_field_map_string_requests_padding_and_missing_weights(tmp_path):
    recs = []
    for r, rid in enumerate(["cmpl-b", "cmpl-a"]):
        for p in range(3):
            for layer in range(2):
                ids = [r + p, 6 + layer] if p != 1 else [5]  # one short list: padded as a dropped slot
                recs.append({"rid": rid, "lyr": layer, "at": p, "chosen": ids})
    src = _write(tmp_path / "m.jsonl", recs)
    fm = {"rid": "request", "lyr": "layer", "at": "position", "chosen": "experts"}
    got = read_trace(import_jsonl(src, tmp_path / "o", field_map=fm, num_experts=10, progress=False))
    assert got.spec.num_experts == 10 and got.spec.top_k == 2
    np.testing.assert_array_equal(got.request, [0, 0, 0, 1, 1, 1])  # renumbered in order of first appearance
    np.testing.assert_array_equal(got.experts_TLK[1], [[5, -1], [5, -1]])
    np.testing.assert_array_equal(got.weights_TLK[1], [[0.5, 0.0], [0.5, 0.0]])
    assert got.provenance["request"].startswith("renumbered")


GOOD = {"request": 0, "layer": 0, "token_idx": 0, "experts": [1, 2], "gating_probs": [0.5, 0.5],
        "phase": "prefill"}
BAD_LINES = {
    "bad json": ('{"request": 0, "layer": 1,', "not valid JSON"),
    "array": ("[1, 2]", "holds a JSON list"),
    "missing": ('{"request": 0, "layer": 1, "experts": [1, 2], "gating_probs": [0.5, 0.5]}',
                "field 'token_idx' is missing or null"),
    "type": ({"experts": "abc"}, "field 'experts' is 'abc'; expected a list of integers"),
    "float id": ({"request": 1.5}, "field 'request' is 1.5; expected an integer"),
    "low id": ({"experts": [-3, 1]}, "field 'experts' is [-3, 1]; expected ids in -1..7"),
    "high id": ({"experts": [8, 1]}, "field 'experts' is [8, 1]; expected ids in -1..7"),
    "too many": ({"experts": [1, 2, 3], "gating_probs": [0.1, 0.2, 0.3]}, "expected at most top_k = 2 ids"),
    "weights length": ({"gating_probs": [1.0]},
                       "field 'gating_probs' is [1.0]; expected one weight per expert id"),
    "nan weight": ('{"request": 0, "layer": 1, "token_idx": 1, "experts": [1, 2], '
                   '"gating_probs": [NaN, 0.5], "phase": "prefill"}',
                   "field 'gating_probs' is [nan, 0.5]; expected finite, non-negative numbers up to 3.4e38 (float32)"),
    "phase": ({"phase": "warmup"}, "field 'phase' is 'warmup'; expected 'prefill' or 'decode'"),
    "position": ({"token_idx": -1}, "field 'token_idx' is -1; expected 0..2**31-1"),
    "null in list": ({"experts": [1, None]}, "field 'experts' is [1, None]; expected a list of integers"),
}


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_bad_line_names_file_line_and_field(tmp_path, case):
    bad, needle = BAD_LINES[case]
    lines = [json.dumps({**GOOD, "layer": layer, "token_idx": p}) for p in range(4) for layer in range(2)]
    lines[5] = bad if isinstance(bad, str) else json.dumps({**GOOD, "layer": 1, "token_idx": 2, **bad})
    src = tmp_path / "bad.jsonl"
    src.write_text("\n".join(lines[:3]) + "\n\n" + "\n".join(lines[3:]) + "\n")  # blank line 4: line 7 is bad
    spec = MoESpec(num_layers=2, num_experts=8, top_k=2)
    with pytest.raises(TraceError) as ei:
        import_jsonl(src, tmp_path / "out", spec=spec, progress=False)
    msg = str(ei.value)
    assert msg.startswith(f"{src} line 7: ") and needle in msg and msg.endswith("."), msg
    assert not (tmp_path / "out").exists()


def _token_records(n_tokens: int, layers: int = 2) -> list[dict]:
    return [{**GOOD, "layer": layer, "token_idx": p} for layer in range(layers) for p in range(n_tokens)]


def test_window_violation_and_incomplete_tokens(tmp_path, small_trace):
    src = _write(tmp_path / "w.jsonl", _token_records(50))  # a token's layer-1 record: 50 records on
    with pytest.raises(TraceError, match=r"w\.jsonl line 51: token \(request 0, position 0\) has this "
                                         r"record 50 records after its first \(line 1\).*window=20 records"):
        import_jsonl(src, tmp_path / "o", window=20, progress=False)
    assert read_trace(import_jsonl(src, tmp_path / "o", window=64, progress=False)).num_tokens == 50
    recs = _token_records(4)
    del recs[6]  # token 2 has no layer-1 record
    with pytest.raises(TraceError, match=r"line 3: token \(request 0, position 2\).*only layer indices \[0\] "
                                         r"of 2 when the file ends"):
        import_jsonl(_write(tmp_path / "x.jsonl", recs), tmp_path / "o2", progress=False)
    assert not (tmp_path / "o2").exists()


def test_duplicate_layer_and_inconsistent_token_fields(tmp_path):
    recs = _token_records(3)
    recs.insert(4, dict(recs[1]))
    with pytest.raises(TraceError, match=r"line 5: token \(request 0, position 1\) has a second record for "
                                         r"layer index 0 \(the first is on line 2\)"):
        import_jsonl(_write(tmp_path / "d.jsonl", recs), tmp_path / "o", progress=False)
    recs = _token_records(3)
    recs[4]["phase"] = "decode"
    with pytest.raises(TraceError, match=r"line 5: field 'phase' is 1 but 0 in the token's first record"):
        import_jsonl(_write(tmp_path / "i.jsonl", recs), tmp_path / "o", progress=False)


def test_argument_and_file_errors(tmp_path):
    with pytest.raises(TraceError, match="does not exist"):
        import_jsonl(tmp_path / "none.jsonl", tmp_path / "o")
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(TraceError, match="holds no records"):
        import_jsonl(tmp_path / "e.jsonl", tmp_path / "o")
    src = _write(tmp_path / "g.jsonl", _token_records(2))
    with pytest.raises(TraceError, match=r"g\.jsonl line 1: field 'experts' is missing "
                                         r"\(looked for \['ids'\]\)"):
        import_jsonl(src, tmp_path / "o", field_map={"ids": "experts"})
    with pytest.raises(ConfigError, match=r"--map x=expert \(field_map\) names 'expert'"):
        import_jsonl(src, tmp_path / "o", field_map={"x": "expert"})
    with pytest.raises(ConfigError, match="--top-k is 0"):
        import_jsonl(src, tmp_path / "o", top_k=0)
    with pytest.raises(TraceError, match="field 'layer' holds"):
        import_jsonl(src, tmp_path / "o", spec=MoESpec(num_layers=1, num_experts=8, top_k=2, layer_ids=(5,)))
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "keep.txt").write_text("x")
    with pytest.raises(ConfigError, match="is not empty .*pass --overwrite"):
        import_jsonl(src, tmp_path / "o", progress=False)
    assert (tmp_path / "o" / "keep.txt").exists()
    # --overwrite onto a directory that is not a trace: refused, the user's file stays (it used to be deleted)
    with pytest.raises(ConfigError, match="holds 'keep.txt', which routecast did not write"):
        import_jsonl(src, tmp_path / "o", progress=False, overwrite=True)
    assert (tmp_path / "o" / "keep.txt").read_text() == "x"


def test_incomplete_token_fails_once_the_window_has_passed(tmp_path, monkeypatch):
    monkeypatch.setattr(importers, "_BLOCK", 2048)  # ~20 records a block: the check runs between blocks
    recs = [{**GOOD, "layer": layer, "token_idx": p} for p in range(200) for layer in range(2)]
    del recs[1]  # token 0 never gets its layer-1 record; the file goes on for 398 more records
    with pytest.raises(TraceError, match=r"line 1: token \(request 0, position 0\) starts here but has only "
                                         r"layer indices \[0\] of 2 when 30 more records \(the window\)"):
        import_jsonl(_write(tmp_path / "w.jsonl", recs), tmp_path / "o", window=30, progress=False)


def test_string_documents_are_numbered_in_order_of_first_appearance(tmp_path, small_trace):
    t = small_trace(4, seed=1)
    recs = _records(t)
    for r in recs:
        r["doc_id"] = f"book-{r['request'] // 2}"  # two requests per document
    got = read_trace(import_jsonl(_write(tmp_path / "log.jsonl", recs), tmp_path / "out", spec=t.spec,
                                  progress=False))
    np.testing.assert_array_equal(got.document, t.request // 2)
    assert got.provenance["document"].startswith("renumbered")
    a, b = got.split(by="document", fractions=(0.5, 0.5), seed=0)
    assert not set(a.document.tolist()) & set(b.document.tolist())
