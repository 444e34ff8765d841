"""Requests for the serving simulation: tasks with prompt/output length distributions, arrivals, SLOs.

    Task(name, prompt (median, sigma, lo, hi), output (...))          one task type, lengths in tokens
    emoe_tasks() -> tuple[Task, ...]                                   eMoE's five evaluation tasks (Table 1)
    make_requests(tasks, n, rate, seed, arrival="poisson"|"gamma", cv) -> Requests   arrays of N requests
    Requests.from_trace(trace)                                         arrivals and lengths of a captured trace
    task_expert_freq(trace, num_tasks, num_layers) -> (T, L, E)       per-task expert frequencies (eq. 2's f_i)

Lengths are log-normal (median x exp(sigma z)), rounded and clipped to [lo, hi]. Arrivals are a Poisson
process of `rate` requests/s (exponential gaps), or Gamma gaps of the same mean and coefficient of variation
`cv` (cv > 1: burstier than Poisson), as vidur and DistServe generate them. Tasks are drawn uniformly (eMoE
§2.1: "tasks have a uniform probability") unless a mix is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from routecast.common.errors import ConfigError

if TYPE_CHECKING:
    from routecast.trace.trace import Trace

ARRIVALS = ("poisson", "gamma")
MIN_RATE = 1e-6  # requests/s: slower arrivals put times beyond float precision of the per-step sums


@dataclass(frozen=True, kw_only=True)
class Lengths:
    """Log-normal token count: median, sigma (of the log), clipped to [lo, hi] tokens."""

    median: float
    sigma: float
    lo: int
    hi: int

    def __post_init__(self) -> None:
        ok = all(math.isfinite(v) for v in (self.median, self.sigma)) and self.median > 0 and self.sigma >= 0
        if not ok or not 1 <= self.lo <= self.hi:
            raise ConfigError(f"task lengths {self} are invalid; expected median > 0, sigma >= 0, 1 <= lo <= hi.")

    def draw(self, z: np.ndarray) -> np.ndarray:
        """(N,) standard normals -> (N,) int64 token counts."""
        return np.clip(np.rint(self.median * np.exp(self.sigma * z)), self.lo, self.hi).astype(np.int64)

    def mean(self) -> float:
        """Mean of the clipped distribution (numerically, on a fixed normal grid): the scheduler's profile."""
        z = np.linspace(-4.0, 4.0, 801)
        w = np.exp(-z * z / 2)
        return float((self.draw(z) * w).sum() / w.sum())


@dataclass(frozen=True, kw_only=True)
class Task:
    """One task type: name, prompt length and output (generated tokens) length distributions."""

    name: str
    prompt: Lengths
    output: Lengths


def emoe_tasks() -> tuple[Task, ...]:
    """eMoE's five tasks (its Table 1). The paper shows only a CDF of generated tokens (its Figure 4) and caps
    generation at 1000 tokens; the medians below are our assumptions from the datasets' published statistics:
    XSUM articles average 431 words and summaries 23 words (Narayan et al. 2018), SQuAD contexts ~120 words,
    tweets and headline pairs are short, conversation turns (Anthropic HH) are short prompts with long
    replies. ~1.3 tokens per word (Llama/Mixtral tokenizers). Generation runs to EOS, so outputs are longer
    than the reference answers. Change them with your own Task tuple."""
    L = Lengths
    return (
        Task(name="sum", prompt=L(median=560, sigma=0.5, lo=64, hi=2048), output=L(median=60, sigma=0.6, lo=8, hi=1000)),
        Task(name="clsfy", prompt=L(median=70, sigma=0.4, lo=16, hi=512), output=L(median=8, sigma=0.8, lo=1, hi=1000)),
        Task(name="qa", prompt=L(median=190, sigma=0.5, lo=32, hi=1024), output=L(median=30, sigma=0.9, lo=2, hi=1000)),
        Task(name="comp", prompt=L(median=50, sigma=0.3, lo=16, hi=256), output=L(median=12, sigma=0.7, lo=1, hi=1000)),
        Task(name="conv", prompt=L(median=90, sigma=0.8, lo=8, hi=2048), output=L(median=220, sigma=0.7, lo=8, hi=1000)),
    )


@dataclass(frozen=True, kw_only=True)
class Requests:
    """N requests sorted by arrival: arrival (N,) seconds, prompt (N,) and output (N,) tokens (output >= 1:
    the prefill step emits the first token), task (N,) index into task_names; task_mean_output (num_tasks,)
    is the profiled mean output per task (eMoE's G_i)."""

    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    task: np.ndarray
    task_names: tuple[str, ...]
    task_mean_output: np.ndarray

    def __post_init__(self) -> None:
        n = self.arrival.shape[0]
        for name in ("prompt", "output", "task"):
            if getattr(self, name).shape != (n,):
                raise ConfigError(f"Requests.{name} has shape {getattr(self, name).shape}; expected ({n},).")
        if n and (not np.all(np.isfinite(self.arrival)) or np.any(np.diff(self.arrival) < 0) or self.arrival[0] < 0):
            raise ConfigError("Requests.arrival holds a NaN, a negative or a decreasing time; expected sorted times >= 0.")
        if n and (self.prompt.min() < 1 or self.output.min() < 1):
            raise ConfigError("Requests has a prompt or output of 0 tokens; expected at least 1 each.")
        if n and (self.task.min() < 0 or self.task.max() >= len(self.task_names)):
            raise ConfigError(f"Requests.task holds an id outside 0..{len(self.task_names) - 1}.")

    @property
    def n(self) -> int:
        return int(self.arrival.shape[0])

    @classmethod
    def from_trace(cls, trace: Trace) -> Requests:
        """Arrival times, prompt and output lengths and tasks of every request of a routing trace."""
        from routecast.trace.trace import DECODE, PREFILL

        req = np.asarray(trace.request)
        ids, inv = np.unique(req, return_inverse=True)
        prompt = np.bincount(inv, weights=np.asarray(trace.phase) == PREFILL, minlength=ids.size).astype(np.int64)
        dec = np.bincount(inv, weights=np.asarray(trace.phase) == DECODE, minlength=ids.size).astype(np.int64)
        arr = np.zeros(ids.size)
        arr[inv] = np.asarray(trace.arrival_s, dtype=np.float64)  # one arrival per request, any sign
        task = np.zeros(ids.size, dtype=np.int64)
        task[inv] = np.asarray(trace.task, dtype=np.int64)
        keep = prompt > 0
        if not keep.any():
            raise ConfigError("the trace holds no prefill tokens; expected requests with prompts to replay.")
        order = np.argsort(arr[keep], kind="stable")
        names = tuple(trace.task_names)
        if np.any(task < 0) or not names:  # requests of no known task form their own group
            task = np.where(task < 0, len(names), task)
            names = (*names, "unknown")
        out = dec[keep][order] + 1  # the prefill emits the first token
        t = task[keep][order]
        means = np.array([out[t == k].mean() if np.any(t == k) else 1.0 for k in range(len(names))])
        a = arr[keep][order]
        return cls(arrival=a - a[0], prompt=prompt[keep][order], output=out, task=t, task_names=names,
                   task_mean_output=means)


def task_expert_freq(trace: Trace, num_tasks: int, num_layers: int) -> np.ndarray:
    """(num_tasks, num_layers, E) per-task expert frequencies f_i (eMoE eq. 2) from a trace's routing, task ids as
    Requests.from_trace numbers them (requests of no known task last); the trace's L_t MoE layers are repeated to
    fill num_layers (a profile deeper than the traced model). A task with no routed tokens gets uniform rows."""
    from routecast.trace.stats_kernels import add_group_counts

    E = trace.spec.num_experts
    c = np.zeros((num_tasks, trace.spec.num_layers, E), np.int64)
    for _, ch in trace.chunks():  # one chunk of routing at a time (a lazy trace's shards are never joined)
        task = ch.tokens["task"].astype(np.int64)
        add_group_counts(ch.experts_TLK, np.where(task < 0, num_tasks - 1, task), c)
    tot = c.sum(2, keepdims=True).astype(np.float64)
    out = np.where(tot > 0, c / np.maximum(tot, 1.0), 1.0 / E)
    return out[:, np.arange(num_layers) % trace.spec.num_layers]


def resample(base: Requests, n: int, rate: float, *, seed: int) -> Requests:
    """N requests drawn with replacement from `base`'s (prompt, output, task) tuples, Poisson arrivals at `rate`."""
    if n < 1 or not (math.isfinite(rate) and rate >= MIN_RATE):
        raise ConfigError(f"resample needs n >= 1 and a finite rate > 0; got n={n}, rate={rate}.")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, n)
    pick = rng.integers(0, base.n, n)
    return Requests(arrival=np.cumsum(gaps) - gaps[0], prompt=base.prompt[pick], output=base.output[pick],
                    task=base.task[pick], task_names=base.task_names, task_mean_output=base.task_mean_output)


def make_requests(
    tasks: tuple[Task, ...], n: int, rate: float, *, seed: int, arrival: str = "poisson", cv: float = 1.0,
    mix: tuple[float, ...] | None = None,
) -> Requests:
    """N requests at `rate` requests/s: arrivals (Poisson, or Gamma with coefficient of variation `cv`), a
    task per request (uniform, or `mix` weights), prompt and output lengths from the task. Seeded."""
    if not isinstance(n, int) or n < 1:
        raise ConfigError(f"requests is {n!r}; expected a positive integer.")
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate >= MIN_RATE):
        raise ConfigError(f"rate is {rate!r}; expected a finite arrival rate >= {MIN_RATE:g} requests/s.")
    if arrival not in ARRIVALS:
        raise ConfigError(f"arrival process is {arrival!r}; expected one of {list(ARRIVALS)}.")
    if not (math.isfinite(cv) and cv > 0):
        raise ConfigError(f"cv is {cv!r}; expected a finite coefficient of variation > 0.")
    if not tasks:
        raise ConfigError("the task list is empty; expected at least one task.")
    w = np.ones(len(tasks)) if mix is None else np.asarray(mix, dtype=np.float64)
    if w.shape != (len(tasks),) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ConfigError(f"task mix is {mix!r}; expected {len(tasks)} non-negative weights with a positive sum.")
    rng = np.random.default_rng(seed)
    if arrival == "poisson":
        gaps = rng.exponential(1.0 / rate, n)
    else:
        k = 1.0 / (cv * cv)  # Gamma shape for the cv; scale keeps the mean gap 1 / rate
        gaps = rng.gamma(k, 1.0 / (rate * k), n)
    arr = np.cumsum(gaps) - gaps[0]  # the first request arrives at t = 0
    task = rng.choice(len(tasks), size=n, p=w / w.sum())
    zp, zo = rng.standard_normal(n), rng.standard_normal(n)
    prompt = np.empty(n, dtype=np.int64)
    output = np.empty(n, dtype=np.int64)
    for k, t in enumerate(tasks):
        m = task == k
        prompt[m] = t.prompt.draw(zp[m])
        output[m] = t.output.draw(zo[m])
    return Requests(arrival=arr, prompt=prompt, output=output, task=task.astype(np.int64),
                    task_names=tuple(t.name for t in tasks),
                    task_mean_output=np.array([t.output.mean() for t in tasks]))
