"""fc-evict's step input in the offload runtime: a one-request step built from the access log equals the general
build from every token's top-k ids (hypothesis: any layers run, tokens, top-k, expert ids)."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from routecast.runtime.offload.engine import step_use_from_ids, step_use_from_log


@st.composite
def steps(draw):
    E = draw(st.integers(2, 16))
    K = draw(st.integers(1, min(4, E)))
    S = draw(st.integers(1, 6))
    ran = draw(st.lists(st.booleans(), min_size=1, max_size=5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ids = [torch.from_numpy(np.stack([rng.choice(E, K, replace=False) for _ in range(S)])) if r else None for r in ran]
    return ids, S, E, draw(st.integers(1, 1000))


@settings(max_examples=60, deadline=None)
@given(steps())
def test_one_request_step_from_the_log_equals_the_general_build(step):
    ids, S, E, first = step
    if all(x is None for x in ids):
        return
    log = []  # what the engine's forward appends per layer run: (layer, distinct experts, tokens per expert)
    for li, x in enumerate(ids):
        if x is not None:
            counts = np.bincount(x.numpy().reshape(-1), minlength=E)
            uniq = np.flatnonzero(counts)
            log.append((li, uniq, counts[uniq]))
    a, b = step_use_from_log(log, first, S, E), step_use_from_ids(ids, first, 1, S, E)
    for f in ("requests", "off", "keys", "counts", "tokens"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
        assert getattr(a, f).dtype == getattr(b, f).dtype
