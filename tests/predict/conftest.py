"""Synthetic traces whose routing is a function of the token id or of the position (predict tests)."""

from __future__ import annotations

import numpy as np
import pytest

from routecast.trace import MoESpec, Trace, make_columns
from tests.conftest import server_schedule


def build_routed_trace(*, by: str = "token", num_requests: int = 40, prompt_len: int = 10, decode_len: int = 5,
                       num_layers: int = 3, num_experts: int = 8, top_k: int = 2, vocab: int = 30,
                       hidden: int = 0, logits: bool = False, seed: int = 0) -> Trace:
    """Each request: prompt_len prefill tokens in one step, then decode_len tokens one per decode round.

    by="token": a token id's K experts per layer are fixed by a random table (conditional-token is exact);
    by="position": the position's K experts are fixed (conditional-position is exact). Token ids are
    uniform over `vocab`, so the global distribution is flat-ish and the probability model is poor.
    """
    rng = np.random.default_rng(seed)
    R, P, D, L, E, K = num_requests, prompt_len, decode_len, num_layers, num_experts, top_k
    req, pos, phase, step = server_schedule(R, P, D)
    T = req.size
    tid = rng.integers(0, vocab, T)
    key, n_keys = (tid, vocab) if by == "token" else (pos, P + D)
    table = np.argsort(rng.random((n_keys, L, E)), axis=-1)[..., :K]
    experts = table[key].astype(np.int16)
    w = rng.random((T, L, K)).astype(np.float32)
    w /= w.sum(-1, keepdims=True)
    return Trace(
        spec=MoESpec(num_layers=L, num_experts=E, top_k=K, hidden_size=hidden),
        tokens=make_columns(T, request=req, position=pos, token_id=tid, phase=phase, step=step, task=req % 2),
        experts_TLK=experts, weights_TLK=w,
        logits_TLE=rng.standard_normal((T, L, E)).astype(np.float32) if logits else None,
        hidden_TLH=rng.standard_normal((T, L, hidden)).astype(np.float32) if hidden else None,
        task_names=("a", "b"), provenance={"generator": "tests.predict", "by": by, "seed": seed},
    )


@pytest.fixture(scope="session")
def routed_trace():
    """Factory: routed_trace(by="token"|"position", num_requests, prompt_len, ...) -> Trace."""
    return build_routed_trace
