"""Source documents per request: the document split keeps every document on one side, old traces still read."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from routecast.common.errors import ConfigError, TraceError
from routecast.trace import MoESpec, Trace, make_columns
from routecast.trace.capture import document_ids
from routecast.trace.io import read_trace, write_trace
from tests.trace.test_capture import tokenizer  # noqa: F401  (a fixture)


def _trace(requests: int, docs: int, seed: int = 0, per_request: int = 3) -> Trace:
    """requests requests of per_request tokens; request r's prompt comes from document (r * 7) % docs."""
    rng = np.random.default_rng(seed)
    req = np.repeat(np.arange(requests), per_request)
    T = req.size
    return Trace(spec=MoESpec(num_layers=2, num_experts=4, top_k=1),
                 tokens=make_columns(T, request=req, step=np.arange(T), document=(req * 7) % docs),
                 experts_TLK=rng.integers(0, 4, (T, 2, 1)).astype(np.int16),
                 weights_TLK=np.ones((T, 2, 1), np.float32))


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 40), st.integers(1, 12), st.integers(0, 1000),
       st.sampled_from([(0.8, 0.2), (0.5, 0.5), (0.6, 0.2, 0.2)]))
def test_document_split_never_shares_a_document_between_parts(requests, docs, seed, fr):
    tr = _trace(requests, docs, seed)
    parts = tr.split(by="document", fractions=fr, seed=seed)
    assert sum(len(p) for p in parts) == len(tr)
    seen = [set(p.document.tolist()) for p in parts]
    for i in range(len(parts)):
        for j in range(i + 1, len(parts)):
            assert not seen[i] & seen[j], f"parts {i} and {j} share documents {seen[i] & seen[j]}"
    # whole requests go with their document
    reqs = [set(p.request.tolist()) for p in parts]
    assert sum(len(r) for r in reqs) == requests


def test_request_split_does_share_documents_so_the_document_split_matters():
    tr = _trace(40, 5)
    a, b = tr.split(by="request", fractions=(0.8, 0.2), seed=0)
    assert set(a.document.tolist()) & set(b.document.tolist())
    a, b = tr.split(by="document", fractions=(0.8, 0.2), seed=0)
    assert not set(a.document.tolist()) & set(b.document.tolist())
    assert len(np.unique(b.document)) == 1 and len(np.unique(a.document)) == 4


def test_unknown_documents_refuse_the_document_split_and_heldout_split_falls_back():
    tr = _trace(10, 3)
    tr.tokens["document"][tr.request == 4] = -1
    with pytest.raises(TraceError, match="1 of 10 requests record no source document"):
        tr.split(by="document")
    tr.tokens["document"][:] = -1
    assert not tr.has_documents
    (a, b), used, note = tr.heldout_split("document", (0.8, 0.2), seed=0)
    assert used == "request" and "splitting by request" in note
    assert [len(x) for x in (a, b)] == [len(p) for p in tr.split("request", (0.8, 0.2), seed=0)]
    known = _trace(10, 3)
    parts, used, note = known.heldout_split("document", (0.8, 0.2), seed=0)
    assert used == "document" and note is None


def test_a_request_with_two_documents_is_refused():
    tr = _trace(6, 3)
    tr.tokens["document"][0] = 2  # request 0's first token names another document than its others
    with pytest.raises(TraceError, match="request 0 records several documents"):
        tr.split(by="document")


def test_negative_document_ids_other_than_minus_one_are_invalid():
    tr = _trace(4, 2)
    tr.tokens["document"][0] = -5
    with pytest.raises(TraceError, match="'document' holds -5"):
        tr.validate()


def test_document_ids_number_strings_by_sorted_name_and_keep_ints():
    ids, names = document_ids([{"document": "wiki/b"}, {"document": "code/a"}, {}, {"document": "wiki/b"}])
    assert ids == [1, 0, -1, 1] and names == ("code/a", "wiki/b")
    assert document_ids([{"document": 7}, {"document": None}]) == ([7, -1], ())
    with pytest.raises(ConfigError, match="mix strings and integers"):
        document_ids([{"document": 7}, {"document": "x"}])


def _downgrade_to_v1(d):
    """Rewrite a trace directory as schema 1 wrote it: no 'document' column anywhere."""
    pq.write_table(pq.read_table(d / "tokens.parquet").drop(["document"]), d / "tokens.parquet")
    m = json.loads((d / "trace.json").read_text())
    for s in m["shards"]:
        f = d / s["file"]
        with safe_open(str(f), framework="numpy") as h:
            meta = h.metadata()
        arrays = load_file(str(f))
        arrays.pop("token.document")
        save_file(arrays, str(f), metadata={**meta, "schema_version": "1"})
        s["bytes"] = f.stat().st_size
    m["schema_version"] = 1
    m["columns"].pop("document")
    (d / "trace.json").write_text(json.dumps(m))


def test_schema_1_traces_read_with_unknown_documents(tmp_path, small_trace):
    tr = small_trace(num_requests=6)
    assert tr.has_documents
    write_trace(tr, tmp_path / "t", shard_tokens=20)
    assert (read_trace(tmp_path / "t").document == tr.document).all()
    _downgrade_to_v1(tmp_path / "t")
    old = read_trace(tmp_path / "t")
    assert (old.document == -1).all() and (old.experts_TLK == tr.experts_TLK).all()
    with pytest.raises(TraceError, match="record no source document"):
        old.split(by="document")
    # a v1 shard without the column but claiming schema 2 is still refused
    f = sorted((tmp_path / "t").glob("routing-*.safetensors"))[0]
    with safe_open(str(f), framework="numpy") as h:
        meta = h.metadata()
    save_file(load_file(str(f)), str(f), metadata={**meta, "schema_version": "2"})
    with pytest.raises(TraceError, match="token.document' is missing"):
        read_trace(tmp_path / "t")


def test_synthetic_requests_are_their_own_documents():
    from routecast.trace.synth import SynthConfig, generate

    tr = generate(SynthConfig(num_layers=2, num_experts=8, top_k=2, num_tokens=600, seed=1))
    assert tr.has_documents and (tr.document == tr.request).all()


def test_capture_records_each_requests_document(tokenizer, tmp_path):  # noqa: F811
    import torch

    from routecast.trace.capture import capture
    from routecast.trace.capture_arch import spec_from_model
    from routecast.trace.io import TraceWriter
    from tests.trace.test_capture import build

    torch.set_num_threads(1)
    model = build("mixtral", seed=1, num_hidden_layers=2, num_local_experts=4)
    prompts = [{"prompt": "the cat sat", "document": "wiki/b"}, {"prompt": "a dog ran", "document": "code/a"},
               {"prompt": "one two", "document": "wiki/b"}, {"prompt": "red blue"}]
    w = TraceWriter(tmp_path / "t", spec_from_model(model))
    capture(model, tokenizer, prompts, w, max_new_tokens=2, batch_size=2, progress=False)
    tr = read_trace(w.close())
    doc_of = {int(r): int(tr.document[i[0]]) for r, i in tr.requests()}
    assert doc_of == {0: 1, 1: 0, 2: 1, 3: -1}  # sorted names: code/a = 0, wiki/b = 1; none given = -1
    assert not tr.has_documents
