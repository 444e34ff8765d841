"""place.compare's held-out split: chronological by source document, so no document is on both sides."""

import dataclasses

import numpy as np
import pytest

from routecast.common.errors import ConfigError
from routecast.place.compare import split_requests
from tests.conftest import build_small_trace


def _docs(per_doc_order):
    """A 12-request trace whose request r comes from document per_doc_order[r]."""
    tr = build_small_trace(num_requests=12, prompt_len=3, decode_len=2)
    doc = np.asarray(per_doc_order)[tr.tokens["request"]]
    return dataclasses.replace(tr, tokens=dict(tr.tokens, document=doc.astype(np.int64)))


def test_documents_split_in_order_of_first_request_and_never_straddle():
    # documents 5, 9, 2, 7 first appear at requests 0, 2, 4, 6; requests 8-11 revisit documents 5 and 9
    tr = _docs([5, 5, 9, 9, 2, 2, 7, 7, 5, 9, 5, 9])
    train, held = split_requests(tr, 0.5)
    assert set(train.document.tolist()) == {5, 9} and set(held.document.tolist()) == {2, 7}
    assert set(train.request.tolist()) == {0, 1, 2, 3, 8, 9, 10, 11}  # later requests of early documents train
    a, b = split_requests(tr, 0.5, by="request")  # the old split: the first 6 requests
    assert set(a.request.tolist()) == set(range(6)) and set(a.document.tolist()) & set(b.document.tolist())
    with pytest.raises(ConfigError, match="of 4 documents leaves an empty part"):
        split_requests(tr, 0.1)


def test_no_documents_falls_back_to_requests_with_a_note(capsys):
    tr = _docs([-1] * 12)
    a, b = split_requests(tr, 0.5)
    assert set(a.request.tolist()) == set(range(6)) and "splitting by request" in capsys.readouterr().err
