"""Serving-realistic decode batches from captured routing: B concurrent requests per step, continuous batching.

A capture runs its prompts in fixed batches (16 at a time in the standard traces) whose decode steps shrink
as requests finish, so its steps are 1-16 tokens. A server keeps B requests running: when one finishes,
the next waiting request takes its place. decode_batches replays a trace's own routing that way: B slots,
each walking through the decode tokens of one captured request after another (a token keeps its
request, position, task and document; its routing is the captured one), so step t holds one decode token of
each of the B running requests. Slots start at a random request and a random point inside it (a server in
steady state, not B requests started together); when a slot's request ends it takes a random request of the
pool. With prefill=True a newly admitted request's prompt (its captured prefill tokens, whole) joins the
step in which the slot switches, making that a mixed step, as chunked-prefill schedulers do.

A pool smaller than B reuses requests: copies run at different points of their text, each under its own
request id. Legend: T steps, B concurrent requests (slots), L layers, K top-k.
"""

from __future__ import annotations

import numpy as np

from routecast.common.errors import ConfigError
from routecast.trace.trace import DECODE, PREFILL, Trace


def _runs(trace: Trace, phase: int) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Rows of `phase` grouped by request, each in position order -> (request ids, {request: rows})."""
    rows = np.flatnonzero(trace.tokens["phase"] == phase)
    req, pos = trace.tokens["request"][rows], trace.tokens["position"][rows]
    rows = rows[np.lexsort((pos, req))]
    ids, first, count = np.unique(trace.tokens["request"][rows], return_index=True, return_counts=True)
    return ids, {int(r): rows[f:f + c] for r, f, c in zip(ids, first, count, strict=True)}


def decode_batches(trace: Trace, *, batch: int, steps: int, seed: int = 0, prefill: bool = False) -> Trace:
    """A Trace of `steps` steps with `batch` decode tokens each (plus admitted prompts with prefill=True).

    trace: the source of routing (e.g. the held-out documents of a capture); only requests with at least one
    decode token are used. Step ids are 0..steps-1; request ids are new (one per slot visit of a request);
    every other column, the routing and the router inputs (when present) are the source rows'. seed: which
    request each slot takes and where the first one starts. Deterministic for a given seed.
    """
    if type(batch) is not int or batch < 1:
        raise ConfigError(f"batch is {batch!r}; expected a positive number of concurrent requests.")
    if type(steps) is not int or steps < 1:
        raise ConfigError(f"steps is {steps!r}; expected a positive number of steps.")
    ids, dec = _runs(trace, DECODE)
    if ids.size == 0:
        raise ConfigError("the trace has no decode tokens; expected captured generation to batch.")
    pre = _runs(trace, PREFILL)[1] if prefill else {}
    rng = np.random.default_rng(seed)
    rows_out: list[np.ndarray] = []
    step_out: list[np.ndarray] = []
    req_out: list[np.ndarray] = []
    visit = 0
    for _ in range(batch):
        r = int(ids[rng.integers(ids.size)])
        t = 0
        off = int(rng.integers(dec[r].size))  # steady state: the first request is already under way
        while t < steps:
            run = dec[r][off:off + steps - t]
            p = pre.get(r) if off == 0 and t > 0 else None  # a newly admitted prompt joins this step
            if p is not None and p.size:
                rows_out.append(p)
                step_out.append(np.full(p.size, t, np.int64))
                req_out.append(np.full(p.size, visit, np.int64))
            rows_out.append(run)
            step_out.append(t + np.arange(run.size, dtype=np.int64))
            req_out.append(np.full(run.size, visit, np.int64))
            t += run.size
            visit += 1
            r, off = int(ids[rng.integers(ids.size)]), 0
    rows, step, req = np.concatenate(rows_out), np.concatenate(step_out), np.concatenate(req_out)
    order = np.lexsort((trace.tokens["phase"][rows] == PREFILL, req, step))  # by step; decode before prompts
    rows, step, req = rows[order], step[order], req[order]
    tokens = {k: v[rows] for k, v in trace.tokens.items()}
    tokens["step"] = step.astype(trace.tokens["step"].dtype)
    tokens["request"] = req.astype(trace.tokens["request"].dtype)
    return Trace(spec=trace.spec, tokens=tokens, experts_TLK=np.asarray(trace.experts_TLK[rows]),
                 weights_TLK=np.asarray(trace.weights_TLK[rows]),
                 logits_TLE=None if trace.logits_TLE is None else np.asarray(trace.logits_TLE[rows]),
                 hidden_TLH=None if trace.hidden_TLH is None else np.asarray(trace.hidden_TLH[rows]),
                 task_names=trace.task_names, source_names=trace.source_names,
                 provenance={**trace.provenance, "decode_batches": {"batch": batch, "steps": steps, "seed": seed,
                                                                   "prefill": prefill, "pool_requests": int(ids.size)}})
