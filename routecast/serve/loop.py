"""The serving simulation: a heap-based discrete-event loop over one engine (in the spirit of vidur).

    simulate(engine, requests, scheduler, slo=SLO(), loader=None, record=False) -> ServeResult
    ServeResult.metrics() -> dict      throughput, goodput, SLO attainment, TTFT / TPOT / E2E p50 p90, p90 TBT

Events are request arrivals and step completions, popped from a heap in time order. At each event the
scheduler (sched.py) may admit waiting requests; the engine then runs either one step that prefills the
admitted prompts (with the running decodes riding along when the scheduler batches them together) or a run
of k decode steps, k = the steps until the first running request finishes, cut at the step boundary after the
next arrival when the scheduler admits mid-batch. A run of decode steps is priced in one vectorised call
(StepPrices.decode_run), so the loop costs O(events), not O(tokens). The prefill step emits each request's
first token (TTFT = its end - arrival); every decode step emits one token per running request.

Metrics (per request): TTFT; TPOT = (finish - first token) / (output - 1); end-to-end latency; SLO met when
TTFT <= its TTFT SLO and TPOT <= its TPOT SLO. p90 TBT is over all decode tokens (a token's gap is the time
since its request's previous token, so a prefill-only step that stalled the decodes counts). Throughput: output tokens / makespan; goodput: output
tokens of requests that met their SLO / makespan.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.serve.engine import Engine, ExpertLoader
from routecast.serve.workload import Requests

ARRIVAL, STEP_END = 0, 1


def parse_slo(value: str | float, what: str) -> tuple[str, float]:
    """'5x' (multiple of the request's unloaded latency) or seconds ('0.5', 0.5) -> (kind, value)."""
    s = str(value).strip().lower()
    kind = "x" if s.endswith("x") else "s"
    try:
        v = float(s[:-1] if kind == "x" else s)
    except ValueError:
        raise ConfigError(f"{what} is {value!r}; expected seconds (e.g. 0.5) or a multiple of the unloaded latency (e.g. 5x).") from None
    if not math.isfinite(v) or v <= 0:
        raise ConfigError(f"{what} is {value!r}; expected a finite value > 0.")
    return kind, v


@dataclass(frozen=True, kw_only=True)
class SLO:
    """TTFT and TPOT targets: seconds, or 'Nx' = N times the request's latency on an idle engine (TTFT: its
    prompt alone; TPOT: one sequence decoding at its mean context). Speculative MoE sets 5x the lightest-load
    latency; per request, so a long prompt gets a longer TTFT target and eMoE's stringency order differs from
    arrival order."""

    ttft: str | float = "5x"
    tpot: str | float = "5x"

    def targets(self, engine: Engine, req: Requests) -> tuple[np.ndarray, np.ndarray]:
        """-> (N,) TTFT targets, (N,) TPOT targets in seconds."""
        p = engine.prices
        k1, v1 = parse_slo(self.ttft, "--slo-ttft")
        k2, v2 = parse_slo(self.tpot, "--slo-tpot")
        pr = np.minimum(req.prompt, p.max_tokens)
        ttft0 = p.base_n[pr] + p.miss_n[pr] + np.interp(req.prompt, p.pre_grid, p.pre_extra)
        ctx = req.prompt + req.output / 2.0
        tpot0 = np.interp(ctx, p.ctx_grid, p.dec_ctx[1]) + p.base_n[1] + p.miss_n[1]
        ttft = ttft0 * v1 if k1 == "x" else np.full(req.n, v1)
        tpot = tpot0 * v2 if k2 == "x" else np.full(req.n, v2)
        return ttft, tpot


@dataclass
class State:
    """What a scheduler sees: time, per-request arrays, the running set and the engine's limits."""

    engine: Engine
    req: Requests
    slo_ttft: np.ndarray
    slo_e2e: np.ndarray
    loader: ExpertLoader | None
    t: float = 0.0
    running: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    left: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    ctx: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    admit_t: np.ndarray = field(default_factory=lambda: np.zeros(0))
    kv_used: int = 0
    prompt_sum_T: np.ndarray = field(default_factory=lambda: np.zeros(0))
    count_T: np.ndarray = field(default_factory=lambda: np.zeros(0))
    c_per_token: float = 0.0

    def fits_kv(self, r: int) -> bool:
        return self.kv_used + int(self.req.prompt[r] + self.req.output[r]) <= self.engine.kv_capacity


@dataclass(frozen=True, kw_only=True)
class ServeResult:
    """Per request (N,): arrival, admit, first (first token), finish (seconds), prompt, output, task, TTFT and TPOT
    targets; tbt (S,) decode-token gaps with weights tbt_w (S,); steps: the step log when recorded; loads."""

    arrival: np.ndarray
    admit: np.ndarray
    first: np.ndarray
    finish: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    task: np.ndarray
    slo_ttft: np.ndarray
    slo_tpot: np.ndarray
    tbt: np.ndarray
    tbt_w: np.ndarray
    experts_loaded: int
    load_s: float
    events: int
    steps: list[dict[str, Any]] | None = None

    @property
    def ttft(self) -> np.ndarray:
        return self.first - self.arrival

    @property
    def tpot(self) -> np.ndarray:
        return np.where(self.output > 1, (self.finish - self.first) / np.maximum(self.output - 1, 1), 0.0)

    @property
    def e2e(self) -> np.ndarray:
        return self.finish - self.arrival

    @property
    def met(self) -> np.ndarray:
        return (self.ttft <= self.slo_ttft) & (self.tpot <= self.slo_tpot)

    def metrics(self) -> dict[str, float]:
        """Aggregate figures (seconds, tokens/s, requests/s, fractions)."""
        span = float(self.finish.max() - self.arrival.min()) or 1e-12
        out = {"requests": float(self.arrival.size), "makespan_s": span,
               "throughput_tok_s": float(self.output.sum()) / span, "throughput_req_s": self.arrival.size / span,
               "goodput_tok_s": float(self.output[self.met].sum()) / span,
               "slo_attainment": float(self.met.mean())}
        for name, v in (("ttft", self.ttft), ("tpot", self.tpot[self.output > 1]), ("e2e", self.e2e)):
            v = v if v.size else np.zeros(1)
            out[f"{name}_mean_s"] = float(v.mean())
            out[f"{name}_p50_s"] = float(np.percentile(v, 50))
            out[f"{name}_p90_s"] = float(np.percentile(v, 90))
        out["tbt_p90_s"] = weighted_percentile(self.tbt, self.tbt_w, 90.0)
        out["experts_loaded"] = float(self.experts_loaded)
        out["load_s"] = self.load_s
        return out


def weighted_percentile(x: np.ndarray, w: np.ndarray, q: float) -> float:
    """q-th percentile of values x (S,) with counts w (S,): the smallest x whose cumulative weight reaches q%."""
    keep = w > 0
    if not keep.any():
        return 0.0
    x, w = x[keep], w[keep]
    o = np.argsort(x, kind="stable")
    cw = np.cumsum(w[o])
    return float(x[o][np.searchsorted(cw, q / 100.0 * cw[-1], side="left")])


def simulate(engine: Engine, req: Requests, scheduler: Any, *, slo: SLO | None = None,
             loader: ExpertLoader | None = None, record: bool = False, slo_engine: Engine | None = None) -> ServeResult:
    """Run every request of `req` through `engine` under `scheduler` (a sched.Scheduler) -> ServeResult.

    Every request finishes (the loop runs until the last one does). SLO multiples ('5x') refer to slo_engine's idle
    latency when given (compare engines against one reference), else to this engine's. Requests whose prompt exceeds the token
    budget, or whose prompt + output exceed the KV capacity, could never be admitted and are refused first.
    """
    cfg, p = engine.config, engine.prices
    N = req.n
    if int(req.prompt.max()) >= cfg.token_budget:
        raise ConfigError(f"a request has a {int(req.prompt.max())}-token prompt; expected prompts below the token "
                          f"budget of {cfg.token_budget} (raise --token-budget).")
    if int((req.prompt + req.output).max()) > engine.kv_capacity:
        raise ConfigError(f"a request needs {int((req.prompt + req.output).max())} KV tokens; expected at most the "
                          f"engine's capacity of {engine.kv_capacity}.")
    ttft_t, tpot_t = (slo or SLO()).targets(slo_engine or engine, req)
    e2e_t = ttft_t + tpot_t * np.maximum(req.task_mean_output[req.task] - 1.0, 0.0)
    nT = len(req.task_names)
    st = State(engine=engine, req=req, slo_ttft=ttft_t, slo_e2e=e2e_t, loader=loader,
               admit_t=np.full(N, np.nan), prompt_sum_T=np.zeros(nT), count_T=np.zeros(nT),
               c_per_token=float(p.base_n[cfg.token_budget]) / cfg.token_budget)
    first = np.full(N, np.nan)
    finish = np.full(N, np.nan)
    last_tok = np.zeros(N)  # time of each request's latest token
    tbt: list[np.ndarray] = []
    tbt_w: list[np.ndarray] = []
    steps: list[dict[str, Any]] | None = [] if record else None
    arrival, prompt, output, task = req.arrival, req.prompt, req.output, req.task
    heap: list[tuple[float, int, int, int]] = [(float(arrival[0]), 0, ARRIVAL, 0)]
    seq, events, busy, load_total = 1, 0, False, 0.0
    pending: dict[str, Any] = {}

    def retire(ids: np.ndarray, t: float) -> None:
        finish[ids] = t
        st.kv_used -= int((prompt[ids] + output[ids]).sum())
        np.subtract.at(st.prompt_sum_T, task[ids], prompt[ids])
        np.subtract.at(st.count_T, task[ids], 1)

    def start(t: float) -> bool:
        nonlocal seq, load_total
        admitted = scheduler.admit(st)
        d = int(st.running.size)
        if admitted:
            A = np.asarray(admitted, dtype=np.int64)
            st.admit_t[A] = t
            st.kv_used += int((prompt[A] + output[A]).sum())
            np.add.at(st.prompt_sum_T, task[A], prompt[A])
            np.add.at(st.count_T, task[A], 1)
            load = loader.admit(A.size, st.prompt_sum_T, st.count_T) if loader is not None else 0.0
            rides = d if scheduler.mixed else 0
            n = int(prompt[A].sum()) + rides
            ctx_mean = float(st.ctx.mean()) if rides else 0.0
            dur = p.step(n, rides, ctx_mean, p.prefill(prompt[A]))
            dur += max(0.0, load - float(p.attn_n[min(n, p.max_tokens)]))  # loading overlaps the step's attention (eMoE §4)
            load_total += load
            if rides:  # each running request's gap since its previous token (a stalled one waited longer)
                tbt.append(t + dur - last_tok[st.running])
                tbt_w.append(np.ones(rides))
                last_tok[st.running] = t + dur
            pending.update(kind="prefill", A=A, k=1 if rides else 0, start=t)
            if steps is not None:
                steps.append({"start": t, "end": t + dur, "prefill": A.tolist(), "decode": rides, "tokens": n, "k": 1,
                              "kv": st.kv_used})
            heapq.heappush(heap, (t + dur, seq, STEP_END, 0))
            seq += 1
            return True
        if d == 0:
            return False
        k = int(st.left.min())
        price_d = scheduler.price_batch(st)
        durs = p.decode_run(d, float(st.ctx.mean()), k, price_d)
        cum = np.cumsum(durs)
        if scheduler.cut_on_arrival and next_arrival[0] < N:
            ta = float(arrival[next_arrival[0]]) - t
            if ta < cum[-1]:
                k = int(np.searchsorted(cum, ta, side="left")) + 1
                durs, cum = durs[:k], cum[:k]
        tbt.append(t + durs[0] - last_tok[st.running])  # first gap: may include prefill-only steps that stalled it
        tbt_w.append(np.ones(d))
        if k > 1:
            tbt.append(durs[1:])
            tbt_w.append(np.full(k - 1, d))
        last_tok[st.running] = t + float(cum[-1])
        pending.update(kind="decode", k=k, start=t)
        if steps is not None:
            steps.append({"start": t, "end": t + float(cum[-1]), "prefill": [], "decode": d, "tokens": d, "k": k,
                          "price_d": price_d, "kv": st.kv_used})
        heapq.heappush(heap, (t + float(cum[-1]), seq, STEP_END, 0))
        seq += 1
        return True

    def advance(k: int, t: float) -> None:
        # k decode tokens for every running request; the finished leave
        if k == 0 or st.running.size == 0:
            return
        st.left -= k
        st.ctx += k
        done = st.left <= 0
        if done.any():
            retire(st.running[done], t)
            keep = ~done
            st.running, st.left, st.ctx = st.running[keep], st.left[keep], st.ctx[keep]

    next_arrival = [0]
    while heap:
        t, _, kind, x = heapq.heappop(heap)
        events += 1
        st.t = t
        if kind == ARRIVAL:
            scheduler.add(x, st)
            next_arrival[0] = x + 1  # the next arrival still to come
            if x + 1 < N:
                heapq.heappush(heap, (float(arrival[x + 1]), seq, ARRIVAL, x + 1))
                seq += 1
            if not busy:
                busy = start(t)
            continue
        advance(pending["k"], t)
        if pending["kind"] == "prefill":
            A = pending["A"]
            first[A] = t
            last_tok[A] = t
            one = output[A] <= 1
            if one.any():
                retire(A[one], t)
            B = A[~one]
            st.running = np.concatenate([st.running, B])
            st.left = np.concatenate([st.left, output[B] - 1])
            st.ctx = np.concatenate([st.ctx, prompt[B]])
        scheduler.after_step(st)
        busy = start(t)
    if np.isnan(finish).any():  # a scheduler that never admits some request is a bug, not a user error
        raise RuntimeError(f"{int(np.isnan(finish).sum())} requests never finished under {scheduler.name}")
    return ServeResult(arrival=arrival, admit=st.admit_t, first=first, finish=finish, prompt=prompt, output=output,
                       task=task, slo_ttft=ttft_t, slo_tpot=tpot_t,
                       tbt=np.concatenate(tbt) if tbt else np.zeros(0),
                       tbt_w=np.concatenate(tbt_w) if tbt_w else np.zeros(0),
                       experts_loaded=loader.loaded_experts if loader is not None else 0, load_s=load_total,
                       events=events, steps=steps)
