"""Request schedulers for the serving simulation (loop.py): which waiting requests join the engine, and when.

    fcfs     request-level (static) batching: when the engine is empty, take requests in arrival order up to
             max_seqs / the token budget / KV capacity, prefill them together, decode until the last one ends;
             finished sequences keep their slot (the step is priced at the batch's size), nobody joins mid-batch
             (FasterTransformer / HF generate style serving).
    vllm     vLLM-style continuous batching (v0 default scheduler): at every step boundary admit waiting
             requests in arrival order while the prompt tokens fit max_num_batched_tokens (= token budget), the
             running sequences max_num_seqs and the KV cache; stop at the first that does not fit (head of line);
             admitted prompts run in a prefill-only step that holds the running decodes back.
    fastgen  DeepSpeed-FastGen-style continuous batching (what eMoE is built on): admitted prompts share the step
             with the running decodes (decode tokens + prompt tokens < token budget), arrival order, head of line.
    emoe     eMoE's Algorithm 1 on fastgen's mixed steps: waiting requests sorted by SLO stringency (the TTFT
             deadline, arrival + TTFT target); each is admitted if |Q_s| + admitted prompt tokens + its prompt
             < T_max (line 4; a request that does not fit is skipped, the scan goes on) and no running request's
             expected latency (eq. 3) is pushed past its SLO by admitting it (line 5).

eMoE's eq. 3, for running request i when a request with W prompt tokens joins:
    t_i = dE + (W + n_i G_i) c + r_i
G_i: i's expected tokens still to generate (its task's profiled mean minus what it generated; when that reaches
0 before i ends, reset to 5% of the mean, as the paper says); n_i: running requests expected to finish after i
(i included, plus the joining one when its G is larger: they all decode during i's last G_i steps); c: the
profiled seconds per input token, a full token-budget step's time / its tokens (from the cost tables); dE: the expert-loading seconds this
admission triggers (the periodic task-aware reload of engine.ExpertLoader when it is due, else 0); r_i: time
since admission. The SLO is end to end: TTFT target + TPOT target x (G - 1), counted from arrival (so the
queueing time before admission is added to t_i). "Leads to an SLO violation" is read as: a request that met its
SLO before the admission would miss it after (one already late does not block everybody else).
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from routecast.common.errors import ConfigError

if TYPE_CHECKING:
    from routecast.serve.loop import State

SCHEDULERS = ("emoe", "fcfs", "vllm", "fastgen")


class Scheduler(ABC):
    """Interface. mixed: admitted prompts share a step with the running decodes; cut_on_arrival: a run of
    decode steps stops at the step boundary after the next arrival so it can be admitted."""

    name = "base"
    mixed = False
    cut_on_arrival = True

    def __init__(self) -> None:
        self.waiting: deque[int] = deque()

    def add(self, r: int, st: State) -> None:
        """Request r arrived (st.t is its arrival time)."""
        self.waiting.append(r)

    @abstractmethod
    def admit(self, st: State) -> list[int]:
        """Requests to admit now (removed from the waiting queue); each scheduler's own rule."""

    def price_batch(self, st: State) -> int:
        """Sequences a decode step is priced at (the running ones, or the padded batch)."""
        return int(st.running.size)

    def after_step(self, st: State) -> None:
        """Called after every step's effects are applied; the default does nothing."""
        return None


def _fcfs_take(st: State, waiting: deque[int], budget: int, seqs: int) -> list[int]:
    """Head-of-line admission: arrival order while prompt tokens fit `budget`, sequences `seqs` and the KV cache."""
    out: list[int] = []
    kv = st.kv_used
    cap = st.engine.kv_capacity
    prompt, output = st.req.prompt, st.req.output
    while waiting and len(out) < seqs:
        r = waiting[0]
        w = int(prompt[r])
        need = w + int(output[r])
        if w > budget or kv + need > cap:
            break
        out.append(waiting.popleft())
        budget -= w
        kv += need
    return out


class FCFS(Scheduler):
    name = "fcfs"
    cut_on_arrival = False

    def __init__(self) -> None:
        super().__init__()
        self.batch = 0

    def admit(self, st: State) -> list[int]:
        if st.running.size:
            return []
        # a static batch prefills all its prompts (in chunks of the token budget): only sequences and KV bind
        out = _fcfs_take(st, self.waiting, 1 << 62, st.engine.config.max_seqs)
        self.batch = len(out)
        return out

    def price_batch(self, st: State) -> int:
        return max(self.batch, int(st.running.size))


class VLLM(Scheduler):
    name = "vllm"

    def admit(self, st: State) -> list[int]:
        cfg = st.engine.config
        return _fcfs_take(st, self.waiting, cfg.token_budget, cfg.max_seqs - int(st.running.size))


class FastGen(Scheduler):
    name = "fastgen"
    mixed = True

    def admit(self, st: State) -> list[int]:
        cfg = st.engine.config
        d = int(st.running.size)
        # line 4 of Algorithm 1 without the SLO check: decode tokens + prompt tokens < T_max
        return _fcfs_take(st, self.waiting, cfg.token_budget - 1 - d, cfg.max_seqs - d)


class EMoE(Scheduler):
    """eMoE Algorithm 1 (see the module docstring); scan_limit bounds the waiting requests examined per call;
    slo_check=False drops line 5 (an ablation: the stringency order and token budget alone)."""

    name = "emoe"
    mixed = True

    def __init__(self, scan_limit: int = 256, slo_check: bool = True) -> None:
        super().__init__()
        self.slo_check = slo_check
        if scan_limit < 1:
            raise ConfigError(f"scan_limit is {scan_limit}; expected a positive integer.")
        self.scan_limit = scan_limit
        self.queue: list[tuple[float, int]] = []  # (TTFT deadline, request), ascending: most stringent first

    def add(self, r: int, st: State) -> None:
        bisect.insort(self.queue, (float(st.req.arrival[r] + st.slo_ttft[r]), r))

    @staticmethod
    def remaining(st: State, ids: np.ndarray, generated: np.ndarray) -> np.ndarray:
        """G_i: profiled mean output of the task minus tokens generated; past it, 5% of the mean, counting down."""
        g0 = st.req.task_mean_output[st.req.task[ids]]
        g = g0 - generated
        step = np.maximum(np.ceil(0.05 * g0), 1.0)
        over = g <= 0
        g[over] = step[over] - np.mod(-g[over], step[over])
        return g

    def admit(self, st: State) -> list[int]:
        if not self.queue:
            return []
        cfg, req = st.engine.config, st.req
        T = int(st.running.size)  # line 1: every scheduled request adds one decode token
        seqs_left = cfg.max_seqs - T
        run = st.running
        gen = (st.ctx - req.prompt[run]).astype(np.float64) + 1.0  # the prefill emitted the first token
        g = self.remaining(st, run, gen)
        r_i = st.t - st.admit_t[run]
        wait_i = st.admit_t[run] - req.arrival[run]
        slo_i = st.slo_e2e[run]
        n_i = (g[None, :] >= g[:, None]).sum(1).astype(np.float64) if run.size else np.zeros(0)
        c = st.c_per_token
        old_ok = wait_i + n_i * g * c + r_i < slo_i
        kv = st.kv_used
        W_acc = 0
        out: list[int] = []
        keep: list[tuple[float, int]] = []
        loader = st.loader
        rest: list[tuple[float, int]] = []
        for i, item in enumerate(self.queue):
            if seqs_left <= 0 or i >= self.scan_limit:
                rest = self.queue[i:]
                break
            r = item[1]
            w = int(req.prompt[r])
            need = w + int(req.output[r])
            if w + T >= cfg.token_budget or kv + need > st.engine.kv_capacity:
                keep.append(item)
                continue
            G_r = float(req.task_mean_output[req.task[r]])
            dE = 0.0
            if loader is not None and loader.due(len(out) + 1):
                ps, ct = st.prompt_sum_T.copy(), st.count_T.copy()
                for a in (*out, r):
                    ps[req.task[a]] += req.prompt[a]
                    ct[req.task[a]] += 1
                dE = loader.delta_s(ps, ct)
            if g.size and self.slo_check:
                n_new = n_i + (G_r >= g)
                new_t = dE + (W_acc + w + n_new * g) * c + r_i
                if np.any(old_ok & (wait_i + new_t >= slo_i)):
                    keep.append(item)
                    continue
            out.append(r)
            T += w
            W_acc += w
            kv += need
            seqs_left -= 1
            # the admitted request joins Q_s for the checks of the next candidates
            n_i = n_i + (G_r >= g)
            g = np.append(g, G_r)
            n_i = np.append(n_i, float((g >= G_r).sum()))
            r_i = np.append(r_i, 0.0)
            wait_i = np.append(wait_i, st.t - req.arrival[r])
            slo_i = np.append(slo_i, st.slo_e2e[r])
            old_ok = np.append(old_ok, wait_i[-1] + (W_acc + n_i[-1] * G_r) * c < slo_i[-1])
        if out:
            self.queue = keep + rest
        return out


def make_scheduler(name: str, **kw) -> Scheduler:
    """A fresh scheduler by name (one of SCHEDULERS)."""
    table = {"emoe": EMoE, "fcfs": FCFS, "vllm": VLLM, "fastgen": FastGen}
    if name not in table:
        raise ConfigError(f"unknown scheduler {name!r}; expected one of {list(SCHEDULERS)}.")
    return table[name](**kw)
