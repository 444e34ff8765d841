"""Requests and continuous batching for synthetic traces (step 9 of the model in synth.py).

Requests arrive as a Poisson process (or all at time 0) with per-task log-normal prompt and output
lengths. Each step holds one decode token of every running request plus chunks of newly admitted
prompts (FIFO, chunked prefill) up to the token budget, with at most max_running requests admitted and
unfinished -- the continuous batching of vLLM / SGLang. The result is the token layout of a trace:
request, position, phase, step, task, arrival_s, in processing order.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from routecast.trace.trace import DECODE, PREFILL


class BatchingConfig(Protocol):
    """The fields of synth.SynthConfig the batching reads (named here so this module need not import synth.py)."""

    num_requests: int
    num_tokens: int
    arrival_rate: float  # requests/s; inf: all arrive at time 0
    prompt_sigma: float
    output_sigma: float
    max_prompt_len: int
    max_output_len: int
    shift_task_mix: tuple[float, ...]
    shift_step: int
    task_stickiness: float
    token_budget: int
    max_running: int
    step_overhead_s: float
    step_token_s: float

    def per_task(self, name: str) -> np.ndarray: ...


def _lognormal_len(median: np.ndarray, sigma: float, z: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return np.clip(np.rint(median * np.exp(sigma * z)), lo, hi).astype(np.int64)


def schedule(cfg: BatchingConfig, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Serving simulation: returns token columns (request, position, phase, step, task, arrival_s, source,
    document) in processing order (by step; decode tokens before prefill chunks inside a step) and task per request.

    The loop runs once per step and once per admitted request, never once per token: decode tokens are
    implied by each request's prefill-completion step and expanded with np.repeat afterwards.
    """
    mix0, mix1 = cfg.per_task("task_mix"), cfg.per_task("shift_task_mix") if cfg.shift_task_mix else None
    p_med, o_med = cfg.per_task("prompt_len"), cfg.per_task("output_len")
    mean_len = float(mix0 @ (p_med * math.exp(cfg.prompt_sigma**2 / 2) + o_med * math.exp(cfg.output_sigma**2 / 2)))
    R = cfg.num_requests or int(1.5 * cfg.num_tokens / max(mean_len, 1.0)) + 16
    # Per-request randomness is drawn up front in arrival order; if the supply runs out before
    # num_tokens is reached, the draw is repeated with twice as many requests (still deterministic).
    while True:
        gaps = rng.exponential(1.0 / cfg.arrival_rate, R) if math.isfinite(cfg.arrival_rate) else np.zeros(R)
        arrival = np.cumsum(gaps)
        u_task, u_stick = rng.random(R), rng.random(R)
        z_p, z_o = rng.standard_normal(R), rng.standard_normal(R)
        out = _run_batches(cfg, arrival, u_task, u_stick, z_p, z_o, mix0, mix1, p_med, o_med)
        if out is not None or cfg.num_requests:
            break
        R *= 2
    chunks, done_step, P, D, task, last_step = out
    c_req, c_start, c_len, c_step = (np.asarray(x, dtype=np.int64) for x in zip(*chunks, strict=True))
    # prefill tokens, one row per chunk expanded
    n_pre = int(c_len.sum())
    off = np.repeat(np.cumsum(c_len) - c_len, c_len)
    pre_req = np.repeat(c_req, c_len)
    pre_pos = np.repeat(c_start, c_len) + np.arange(n_pre) - off
    pre_step = np.repeat(c_step, c_len)
    # decode tokens: request r decodes at steps done+1 .. done+D, cut at the last simulated step
    started = done_step >= 0
    n_dec_r = np.where(started, np.clip(np.minimum(D, last_step - done_step), 0, None), 0)
    dec_req = np.repeat(np.arange(len(D)), n_dec_r)
    j = np.arange(int(n_dec_r.sum())) - np.repeat(np.cumsum(n_dec_r) - n_dec_r, n_dec_r)
    dec_pos = P[dec_req] + j
    dec_step = done_step[dec_req] + 1 + j
    req = np.concatenate([pre_req, dec_req])
    pos = np.concatenate([pre_pos, dec_pos])
    step = np.concatenate([pre_step, dec_step])
    phase = np.concatenate([np.full(n_pre, PREFILL), np.full(dec_req.size, DECODE)]).astype(np.int8)
    order = np.lexsort((pos, req, -phase, step))  # decode first inside a step, as vLLM schedules
    req, pos, step, phase = req[order], pos[order], step[order], phase[order]
    cols = {"request": req, "position": pos, "phase": phase, "step": step, "task": task[req],
            "arrival_s": arrival[req], "source": np.zeros(req.size, dtype=np.int16),
            # The generator draws every request's tokens independently (no text is shared between requests),
            # so each request is its own document and the document split equals the request split.
            "document": req}
    return cols, task


def _run_batches(cfg, arrival, u_task, u_stick, z_p, z_o, mix0, mix1, p_med, o_med):
    """Step loop of continuous batching; None when the requests run out before num_tokens."""
    R = arrival.size
    P = np.zeros(R, np.int64)
    D = np.zeros(R, np.int64)
    task = np.full(R, -1, np.int16)
    done_step = np.full(R, -1, np.int64)
    start_ev: dict[int, int] = {}
    stop_ev: dict[int, int] = {}
    free_ev: dict[int, int] = {}
    chunks: list[tuple[int, int, int, int]] = []
    clock, step, q, head, head_done = 0.0, 0, 0, -1, 0
    n_dec = n_active = n_finished = 0
    total, prev_task = 0, -1
    while True:
        n_dec += start_ev.pop(step, 0) - stop_ev.pop(step, 0)
        freed = free_ev.pop(step, 0)
        n_active -= freed
        n_finished += freed
        if cfg.num_requests and n_finished >= R:
            return chunks, done_step, P, D, task, step - 1
        budget = cfg.token_budget - n_dec
        n_pre = 0
        while budget > 0:
            if head < 0:
                if q >= R or arrival[q] > clock or n_active >= cfg.max_running:
                    break
                head, head_done = q, 0
                q += 1
                n_active += 1
                mix = mix1 if 0 <= cfg.shift_step <= step and mix1 is not None else mix0
                # Stay on the previous request's task (a burst) unless the mix in force excludes it.
                stay = prev_task >= 0 and mix[prev_task] > 0 and u_stick[head] < cfg.task_stickiness
                t = prev_task if stay else int(min(np.searchsorted(np.cumsum(mix), u_task[head], side="right"),
                                                   mix.size - 1))
                task[head] = prev_task = t
                P[head] = _lognormal_len(p_med[t], cfg.prompt_sigma, z_p[head], 1, cfg.max_prompt_len)
                D[head] = _lognormal_len(o_med[t], cfg.output_sigma, z_o[head], 0, cfg.max_output_len)
            c = int(min(P[head] - head_done, budget))
            chunks.append((head, head_done, c, step))
            head_done += c
            budget -= c
            n_pre += c
            if head_done == P[head]:
                done_step[head] = step
                d = int(D[head])
                if d:
                    start_ev[step + 1] = start_ev.get(step + 1, 0) + 1
                    stop_ev[step + 1 + d] = stop_ev.get(step + 1 + d, 0) + 1
                # a request leaves the batch (and stops decoding) after its last decode step
                free_ev[step + 1 + d] = free_ev.get(step + 1 + d, 0) + 1
                head = -1
        n_tok = n_dec + n_pre
        if n_tok == 0:
            if q >= R:
                return None if not cfg.num_requests else (chunks, done_step, P, D, task, step - 1)
            # Idle: nothing runs, so admission failed only because the next request has not arrived.
            clock = max(clock, float(arrival[q]))
            continue
        clock += cfg.step_overhead_s + cfg.step_token_s * n_tok
        total += n_tok
        step += 1
        if not cfg.num_requests and total >= cfg.num_tokens:
            return chunks, done_step, P, D, task, step - 1
