"""cache replay reads the routing window by window: the accesses do not depend on the window size."""

import dataclasses

import numpy as np

from routecast.cache.replay import build_accesses
from routecast.trace.io import read_trace, write_trace
from tests.conftest import build_small_trace


def test_accesses_are_the_same_for_any_window_of_a_sharded_trace(tmp_path):
    tr = build_small_trace()
    write_trace(tr, tmp_path / "t", shard_tokens=37)  # shards cut through steps
    lazy = read_trace(tmp_path / "t")
    whole = build_accesses(tr)
    for rows in (None, 1, 50):
        got = build_accesses(lazy, rows)
        for f in dataclasses.fields(whole):
            np.testing.assert_array_equal(getattr(got, f.name), getattr(whole, f.name), err_msg=f"{rows} {f.name}")
    # the accesses are the per-(step, layer) unions: every routed slot is counted once per token
    assert whole.req_tokens.sum() == (np.asarray(tr.experts_TLK) >= 0).sum()
