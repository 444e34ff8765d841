"""Synthetic routing traces from a documented generative model (`routecast synth`).

Shapes (legend in spec.py): T tokens, L MoE layers, E experts, K top-k, G expert groups, C contexts.
A trace is generated in two passes: a serving simulation that lays tokens out in requests and steps,
then routing, layer by layer. The generative model, with the SynthConfig knob of each part:

1. Geometry: `num_layers`, `num_experts`, `top_k`, `n_group`/`topk_group` (grouped routing),
   `hidden_size`, `expert_bytes`, `num_shared_experts`, `layer_ids`, `name`.
2. Expert popularity: each layer draws a log-popularity over its E experts, either Zipf
   (`popularity="zipf"`, exponent `popularity_alpha`, the ranks randomly permuted per layer so that
   different experts are hot in different layers) or Dirichlet (`popularity="dirichlet"`,
   concentration `popularity_alpha`).
3. Tasks: `task_names`, mixed by `task_mix`. Each task draws its own log-popularity P_task and uses
   (1 - d) * P_shared + d * P_task with d = `task_divergence`, scaled by its `task_sharpness`
   (> 1 sharpens the task's skew). Successive requests keep the previous request's task with
   probability `task_stickiness` (datasets arriving in bursts).
4. Token-expert affinity: token ids are Zipf over `vocab_size` ids (exponent `vocab_zipf`, frequency
   ranks permuted over ids). Each token id prefers `token_fanout` experts per layer; preferred expert j
   of m gets the log-odds bonus `token_strength` * (m - j) / m, scaled down linearly with depth to
   (1 - `token_depth_decay`) at the last layer. The preferences form paths: a hash of the id picks them
   at layer 0 (inside `topk_group` groups when routing is grouped), and at each next layer they are the
   primary successors (6) of the previous ones, so a token id routes along fixed paths.
5. Request context: each request prefers `request_fanout` experts per layer (a hash of request id and
   layer) with the same profile and strength `request_strength` (a prompt's topic).
6. Inter-layer affinity: a per-layer transition table sends each expert e of layer l - 1 to
   `layer_fanout` successor experts of layer l; each of a token's K experts at l - 1 adds the bonus
   `layer_strength` * (m - j) / m to its successor j at layer l. Each successor column is a permutation
   (every expert is the j-th successor of exactly one expert, so transitions do not skew the load);
   with grouped routing it maps whole groups onto groups.
7. Temporal drift: log-popularity takes a Gaussian random walk, one increment of std `drift_sigma`
   per window of `drift_window` steps (multiplicative log-normal drift of popularity).
8. Semantic shift: from step `shift_step` on (-1 = never) every popularity (shared and per task) is
   mixed with a fresh draw, (1 - s) * old + s * new with s = `shift_strength`, and requests admitted
   from then on draw their task from `shift_task_mix` (empty = unchanged).
9. Requests and batching: Poisson arrivals at `arrival_rate` requests/s (inf = all at time 0);
   per-task log-normal prompt and output lengths (medians `prompt_len` / `output_len`, shapes
   `prompt_sigma` / `output_sigma`, capped at `max_prompt_len` / `max_output_len`). Continuous batching:
   each step holds one decode token of every running request plus chunks of the prompts of newly
   admitted requests (FIFO, chunked prefill) up to `token_budget` tokens, with at most `max_running`
   requests admitted and unfinished. The clock advances `step_overhead_s + step_token_s * tokens` per
   step and jumps to the next arrival when idle. The trace stops at the step where `num_tokens` is
   reached, or after all `num_requests` requests finish when that is > 0.
10. Top-k selection: a token's score for expert e is its context's base log-popularity (task, drift
   window, shift) plus the bonuses of 4-6; the K experts are the top-K of score + Gumbel(0, 1) noise
   (the Gumbel-top-k trick: K draws without replacement from softmax(score)). With grouped routing the
   `topk_group` groups are first drawn the same way from their total exp-score mass, then the K
   experts inside them. Routing weights are the softmax of the K chosen (perturbed) scores.

Step 10 is computed lazily so that no dense (T, E) noise is drawn: bonus experts are perturbed
explicitly, and the top-K of the remaining experts (whose scores are the shared base of their
context) come from the top-down Gumbel process -- the largest of a set with mass Z is Gumbel(log Z),
its argmax is a categorical draw, and each next value is a Gumbel truncated below the previous one;
drawing stops at the first value that cannot enter the top-K. Argmax draws are i.i.d. categorical
draws (guide tables) that skip experts already taken, or one dense Gumbel-top-k for rows whose
remaining mass is small. The result has exactly the distribution of dense Gumbel-top-k
(tests/trace/test_synth.py checks it against a dense reference) at O(K + bonuses) work per token and
layer.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.trace.spec import MoESpec
from routecast.trace.synth_batching import schedule
from routecast.trace.synth_kernel import route_layer
from routecast.trace.trace import Trace, make_columns

_PER_TASK = ("task_mix", "task_sharpness", "prompt_len", "output_len", "shift_task_mix")


@dataclass(frozen=True, kw_only=True)
class SynthConfig:
    """Every knob of the generative model (see the module docstring for what each does)."""

    # 1. geometry
    name: str = "synthetic"
    num_layers: int = 4
    num_experts: int = 8
    top_k: int = 2
    n_group: int = 1
    topk_group: int = 1
    hidden_size: int = 0
    expert_bytes: int = 0
    num_shared_experts: int = 0
    layer_ids: tuple[int, ...] = ()
    # size and seed
    num_tokens: int = 65536
    num_requests: int = 0
    seed: int = 0
    # 2. popularity
    popularity: str = "zipf"
    popularity_alpha: float = 1.0
    # 3. tasks
    task_names: tuple[str, ...] = ("default",)
    task_mix: tuple[float, ...] = ()
    task_divergence: float = 0.0
    task_sharpness: tuple[float, ...] = (1.0,)
    task_stickiness: float = 0.0
    # 4. tokens
    vocab_size: int = 32000
    vocab_zipf: float = 1.1
    token_strength: float = 0.0
    token_fanout: int = 2
    token_depth_decay: float = 0.0
    # 5. request context
    request_strength: float = 0.0
    request_fanout: int = 2
    # 6. inter-layer
    layer_strength: float = 0.0
    layer_fanout: int = 2
    # 7-8. drift and shift
    drift_sigma: float = 0.0
    drift_window: int = 256
    shift_step: int = -1
    shift_strength: float = 1.0
    shift_task_mix: tuple[float, ...] = ()
    # 9. requests and batching
    arrival_rate: float = math.inf
    prompt_len: tuple[float, ...] = (512.0,)
    prompt_sigma: float = 0.0
    output_len: tuple[float, ...] = (128.0,)
    output_sigma: float = 0.0
    max_prompt_len: int = 32768
    max_output_len: int = 8192
    token_budget: int = 8192
    max_running: int = 256
    step_overhead_s: float = 0.005
    step_token_s: float = 1e-5

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, list):
                object.__setattr__(self, f.name, tuple(v))
        self._validate()

    def _validate(self) -> None:
        def fail(field: str, value: Any, expected: str) -> None:
            raise ConfigError(f"SynthConfig.{field} is {value!r}; expected {expected}.")

        positive = ("num_layers", "num_experts", "top_k", "n_group", "topk_group", "vocab_size", "token_fanout",
                    "request_fanout", "layer_fanout", "drift_window", "max_prompt_len", "max_output_len",
                    "token_budget", "max_running")
        for f in positive + ("num_tokens", "num_requests", "seed", "hidden_size", "expert_bytes", "num_shared_experts"):
            v, lo = getattr(self, f), 1 if f in positive else 0
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                fail(f, v, "a positive integer" if lo else "a non-negative integer")
        if self.num_tokens == 0 and self.num_requests == 0:
            fail("num_tokens", 0, "a positive token count when num_requests is 0")
        if self.top_k > self.num_experts:
            fail("top_k", self.top_k, f"at most num_experts = {self.num_experts}")
        if self.num_experts % self.n_group or self.topk_group > self.n_group:
            fail("n_group", (self.n_group, self.topk_group),
                 f"n_group dividing num_experts = {self.num_experts} and topk_group <= n_group")
        if self.topk_group * (self.num_experts // self.n_group) < self.top_k:
            fail("topk_group", self.topk_group, f"enough groups to hold top_k = {self.top_k} experts")
        if self.layer_ids and len(self.layer_ids) != self.num_layers:
            fail("layer_ids", self.layer_ids, f"{self.num_layers} entries (one per MoE layer) or empty")
        if self.popularity not in ("zipf", "dirichlet"):
            fail("popularity", self.popularity, "'zipf' or 'dirichlet'")
        for f in ("popularity_alpha", "vocab_zipf", "token_strength", "request_strength", "layer_strength",
                  "drift_sigma", "prompt_sigma", "output_sigma", "step_overhead_s", "step_token_s"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                fail(f, v, "a finite non-negative number")
        if self.popularity == "dirichlet" and self.popularity_alpha <= 0:
            fail("popularity_alpha", self.popularity_alpha, "a positive Dirichlet concentration")
        for f in ("task_divergence", "task_stickiness", "token_depth_decay", "shift_strength"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                fail(f, v, "a number in [0, 1]")
        if not (isinstance(self.arrival_rate, (int, float)) and self.arrival_rate > 0):
            fail("arrival_rate", self.arrival_rate, "a positive rate in requests/s (inf = all at time 0)")
        if self.shift_step < -1:
            fail("shift_step", self.shift_step, "a step index >= 0, or -1 for no shift")
        n = len(self.task_names)
        if n < 1 or len(set(self.task_names)) != n or not all(isinstance(s, str) and s for s in self.task_names):
            fail("task_names", self.task_names, "one or more distinct non-empty names")
        for f in _PER_TASK:
            v = getattr(self, f)
            empty_ok = f in ("task_mix", "shift_task_mix")
            if len(v) not in ((0, 1, n) if empty_ok else (1, n)):
                fail(f, v, f"{'0, ' if empty_ok else ''}1 or {n} values (one per task)")
            if any(not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0 for x in v):
                fail(f, v, "finite non-negative numbers")
            if f in ("task_mix", "shift_task_mix") and v and sum(v) <= 0:
                fail(f, v, "weights with a positive sum")
        if min(self.prompt_len) < 1:
            fail("prompt_len", self.prompt_len, "medians >= 1 token")
        self.spec()  # MoESpec's limits (E <= 32768 int16 ids, L x E, layer_ids) fail before any table is allocated

    # ---------------------------------------------------------------- helpers
    def spec(self) -> MoESpec:
        """The MoESpec of the traces this config generates."""
        return MoESpec(
            num_layers=self.num_layers, num_experts=self.num_experts, top_k=self.top_k,
            hidden_size=self.hidden_size, expert_bytes=self.expert_bytes,
            num_shared_experts=self.num_shared_experts, layer_ids=self.layer_ids,
            n_group=self.n_group, topk_group=self.topk_group, name=self.name)

    def per_task(self, field: str) -> np.ndarray:
        """A per-task knob broadcast to (num_tasks,) float64 (task_mix: normalised, empty = uniform)."""
        v = np.asarray(getattr(self, field), dtype=np.float64)
        n = len(self.task_names)
        if v.size == 0:
            v = np.ones(n)
        v = np.broadcast_to(v, (n,)).copy()
        return v / v.sum() if field in ("task_mix", "shift_task_mix") else v

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (tuples as lists, inf as the string 'inf') for trace provenance."""
        return {k: (list(v) if isinstance(v, tuple) else "inf" if v == math.inf else v)
                for k, v in dataclasses.asdict(self).items()}


# ==================================================================== generation
def generate(cfg: SynthConfig) -> Trace:
    """Generate a Trace from cfg (deterministic for a given cfg, seed included).

    Returns a Trace with experts_TLK int16 (each row K distinct experts, ordered by weight descending),
    weights_TLK float32 (sum 1 over K), and every token column filled; no logits or hidden states.
    """
    cols, provenance, rngs = prepare(cfg)
    experts_TLK, weights_TLK = _route(cfg, cols, *rngs)
    return Trace(spec=cfg.spec(), tokens=cols, experts_TLK=experts_TLK, weights_TLK=weights_TLK,
                 task_names=cfg.task_names, source_names=("synthetic",), provenance=provenance)


def prepare(cfg: SynthConfig) -> tuple[dict[str, np.ndarray], dict[str, Any], tuple]:
    """The serving layout of cfg's trace before routing -> (token columns (T,), provenance, routing rngs).

    The columns (~37 bytes a token) are held whole; routing (L x K x 6 bytes a token) comes from
    route_blocks(cfg, cols, *rngs, rows=...) or _route(cfg, cols, *rngs).
    """
    streams = np.random.SeedSequence(cfg.seed).spawn(6)
    rng_req, rng_tok, rng_pop, rng_drift, rng_route = (np.random.default_rng(s) for s in streams[:5])
    salts = streams[5].generate_state(2, dtype=np.uint32)
    cols, task_R = schedule(cfg, rng_req)  # token layout first: routing depends on step and task
    T = cols["request"].shape[0]
    cols["token_id"] = _draw_token_ids(cfg, rng_tok, T)
    provenance = {"generator": "routecast.trace.synth", "config": cfg.to_dict(), "requests": int(task_R.size)}
    return make_columns(T, **cols), provenance, (rng_pop, rng_drift, rng_route, salts)


def _draw_token_ids(cfg: SynthConfig, rng: np.random.Generator, T: int) -> np.ndarray:
    """(T,) int32 token ids, Zipf(vocab_zipf) over frequency ranks, ranks permuted over ids."""
    V = cfg.vocab_size
    cdf = np.cumsum(np.arange(1, V + 1, dtype=np.float64) ** -cfg.vocab_zipf)
    rank_to_id = rng.permutation(V).astype(np.int32)
    return rank_to_id[np.minimum(np.searchsorted(cdf, rng.random(T) * cdf[-1], side="right"), V - 1)]


def _log_popularity(cfg: SynthConfig, rng: np.random.Generator, n: int) -> np.ndarray:
    """(n, L, E) float64 log-probabilities, one independent popularity draw per (n, layer)."""
    L, E = cfg.num_layers, cfg.num_experts
    if cfg.popularity == "zipf":
        base = -cfg.popularity_alpha * np.log(np.arange(1, E + 1, dtype=np.float64))
        ranks = np.argsort(rng.random((n, L, E)), axis=-1)  # a random permutation per (n, layer)
        logp = base[ranks]
    else:
        # Gamma draws normalise to a Dirichlet; the floor keeps tiny-alpha draws finite.
        logp = np.log(np.maximum(rng.gamma(cfg.popularity_alpha, size=(n, L, E)), 1e-300))
        logp = np.maximum(logp, logp.max(axis=-1, keepdims=True) - 30.0)
    return logp - _logsumexp(logp)


def _logsumexp(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    return m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def _hash_experts(salt: np.uint32, key: np.ndarray, layer: int, L: int, m: int, E: int) -> np.ndarray:
    """(n, m) int64 expert ids = fmix32(salt, key, layer, j) mod E: a fixed pseudo-random table
    key x layer x j -> expert that needs no (vocab, L, m) array in memory (32-bit ops vectorise well)."""
    with np.errstate(over="ignore"):
        x = (key.astype(np.uint32)[:, None] * np.uint32(L * m) + np.uint32(layer * m)
             + np.arange(m, dtype=np.uint32)[None, :]) * np.uint32(0x9E3779B1) + salt
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x85EBCA6B)
        x ^= x >> np.uint32(13)
        x *= np.uint32(0xC2B2AE35)
        x ^= x >> np.uint32(16)
    return (x % np.uint32(E)).astype(np.int64)


class _Contexts:
    """Base log-popularity per context (task, drift window, before/after the shift), built per layer.

    ctx_T: (T,) context index of each token; layer(l) gives the tables that routing samples from."""

    def __init__(self, cfg: SynthConfig, cols: dict[str, np.ndarray], rng_pop, rng_drift) -> None:
        self.cfg = cfg
        nt = len(cfg.task_names)
        shared, per_task = _log_popularity(cfg, rng_pop, 1)[0], _log_popularity(cfg, rng_pop, nt)
        shifted = cfg.shift_step >= 0
        if shifted:
            s = cfg.shift_strength
            shared_new, task_new = _log_popularity(cfg, rng_pop, 1)[0], _log_popularity(cfg, rng_pop, nt)
            shared = np.stack([shared, (1 - s) * shared + s * shared_new])
            per_task = np.stack([per_task, (1 - s) * per_task + s * task_new])
        else:
            shared, per_task = shared[None], per_task[None]
        d, sharp = cfg.task_divergence, cfg.per_task("task_sharpness")
        self.lp_PNLE = sharp[None, :, None, None] * ((1 - d) * shared[:, None] + d * per_task)  # P: shift phase
        step, task = cols["step"], cols["task"].astype(np.int64)
        window = step // cfg.drift_window if cfg.drift_sigma > 0 else np.zeros_like(step)
        post = (step >= cfg.shift_step).astype(np.int64) if shifted else np.zeros_like(step)
        W = int(window.max()) + 1 if step.size else 1
        # Random walk in log space: window w carries the sum of w increments (window 0 none).
        inc = cfg.drift_sigma * rng_drift.standard_normal((W, cfg.num_layers, cfg.num_experts))
        inc[0] = 0.0
        self.drift_WLE = np.cumsum(inc, axis=0)
        key = (post * W + window) * nt + task
        uniq, self.ctx_T = np.unique(key, return_inverse=True)
        self.c_task, rest = uniq % nt, uniq // nt
        self.c_window, self.c_post = rest % W, rest // W

    def layer(self, l: int, sub: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Tables of layer l: logp (C*E,) flat float32 log-probabilities, p_CG group masses, cdf (C*E,)
        per-context CDFs and guide (C*B,), the first index whose CDF exceeds b/B (a guide table, so a
        categorical draw costs O(1) expected steps). sub: only these contexts, in this order (C = len(sub))."""
        cfg = self.cfg
        sub = np.arange(self.c_task.size) if sub is None else sub
        c_post, c_task, c_window = self.c_post[sub], self.c_task[sub], self.c_window[sub]
        logp = self.lp_PNLE[c_post, c_task, l] + self.drift_WLE[c_window, l]
        logp = logp - _logsumexp(logp)
        p = np.exp(logp)
        C, E = p.shape
        cdf = np.cumsum(p, axis=1)
        cdf /= cdf[:, -1:]
        cdf[:, -1] = 1.0
        B = 16 * E  # buckets per row: short walks even through the long tail of a skewed row
        # Offsetting row i by i makes the stacked CDFs one sorted array, so one searchsorted serves all.
        q = (np.arange(C)[:, None] + np.arange(B)[None, :] / B).ravel()
        guide = np.searchsorted((cdf + np.arange(C)[:, None]).ravel(), q, side="right")
        guide = np.minimum(guide - np.repeat(np.arange(C) * E, B), E - 1)
        return {"logp": logp.ravel().astype(np.float32), "p": p.ravel(), "p_CG": p.reshape(C, cfg.n_group, -1).sum(axis=2),
                "cdf": cdf.ravel(), "guide": guide, "B": B}


def _profile(m: int) -> np.ndarray:
    return (m - np.arange(m, dtype=np.float64)) / m  # bonus of preferred expert j of m, relative


def _route(cfg: SynthConfig, cols, rng_pop, rng_drift, rng: np.random.Generator, salts):
    """Lazy Gumbel-top-k routing of the whole trace in one block (module docstring, step 10).

    Returns int16 / float32 (T, L, K); the same draws as route_blocks with one block of all T rows.
    """
    T = cols["request"].shape[0]
    for _, experts, weights in route_blocks(cfg, cols, rng_pop, rng_drift, rng, salts, rows=max(T, 1)):
        return experts, weights
    L, K = cfg.num_layers, cfg.top_k
    return np.zeros((0, L, K), np.int16), np.zeros((0, L, K), np.float32)


def route_blocks(cfg: SynthConfig, cols, rng_pop, rng_drift, rng: np.random.Generator, salts, *, rows: int):
    """Route `rows` tokens at a time through every layer: yield (first row, experts int16 (n, L, K),
    weights float32 (n, L, K)) in row order, so a trace is written as it is generated.

    Memory is O(rows x L x K) plus the per-token columns: a token's layers depend only on its own earlier
    layers, so blocks of tokens are independent given the shared tables (popularity, drift, successors).
    Inside a block layers go one by one, each routed row by row by the compiled kernel (synth_kernel.py);
    the draws depend on `rows`.
    """
    T, L, K = cols["request"].shape[0], cfg.num_layers, cfg.top_k
    ctx = _Contexts(cfg, cols, rng_pop, rng_drift)
    succ = _successors(cfg, rng_pop)
    for b0 in range(0, T, rows):
        b1 = min(T, b0 + rows)
        n = b1 - b0
        bcols = {k: v[b0:b1] for k, v in cols.items()}
        sub, c_blk = np.unique(ctx.ctx_T[b0:b1], return_inverse=True)  # contexts present in this block
        c_blk = c_blk.astype(np.int64)
        experts = np.zeros((n, L, K), dtype=np.int16)
        weights = np.zeros((n, L, K), dtype=np.float32)
        tok_pref = None
        for l in range(L):
            # Token paths: a token id's preferred experts at layer 0 are a hash of the id; at each next layer
            # they are the primary successors of the previous ones, so a token id routes along fixed paths.
            if cfg.token_strength > 0:
                tok_pref = _token_start(cfg, bcols["token_id"], salts[0]) if l == 0 else succ[l][tok_pref, 0]
            bonus = _bonus_sources(cfg, l, bcols, succ, experts, salts, tok_pref)
            route_layer(rng, c_blk, bonus, ctx.layer(l, sub), cfg.topk_group, experts[:, l], weights[:, l])
        yield b0, experts, weights


def _successors(cfg: SynthConfig, rng: np.random.Generator) -> np.ndarray:
    """(L, E, layer_fanout) successors at layer l of the experts of layer l - 1.

    Column j is a random permutation, so every expert is the j-th successor of exactly one expert and
    transitions alone do not skew the load. With grouped routing the permutation maps whole groups to
    groups (a group permutation composed with permutations inside groups), so a token's experts stay
    within few groups from layer to layer, as group-limited routing requires.
    """
    L, E, G, m = cfg.num_layers, cfg.num_experts, cfg.n_group, cfg.layer_fanout
    gs = E // G
    gperm = np.argsort(rng.random((L, m, G)), axis=2)
    wperm = np.argsort(rng.random((L, m, G, gs)), axis=3)
    e = np.arange(E)
    succ = gperm[:, :, e // gs] * gs + wperm[:, :, e // gs, e % gs]  # (L, m, E)
    return succ.transpose(0, 2, 1)


def _token_start(cfg: SynthConfig, token_id: np.ndarray, salt: np.uint32) -> np.ndarray:
    """(T, token_fanout) preferred experts of each token at layer 0 (a hash of the id); with grouped
    routing they fall in at most topk_group groups of the token."""
    E, G, m = cfg.num_experts, cfg.n_group, cfg.token_fanout
    if G == 1:
        return _hash_experts(salt, token_id, 0, 1, m, E)
    gs, tg = E // G, cfg.topk_group
    groups = _hash_experts(salt, token_id, 0, 1, tg, G)
    within = _hash_experts(salt ^ np.uint32(0x5BD1E995), token_id, 0, 1, m, gs)
    return groups[:, np.arange(m) % tg] * gs + within


def _bonus_sources(cfg, l, cols, succ, experts, salts, tok_pref) -> dict[str, np.ndarray]:
    """The bonus experts of layer l for the kernel: tok (n, mt) and req (n, mr) int64 preferred experts of
    each token id and request, prev (n, K) int16 the previous layer's experts with their successors succ
    (E, ml) int64, and the log-odds bonus profiles bon_tok (mt,), bon_req (mr,), bon_lay (ml,) float64
    (a source that is off has width 0)."""
    n, E, L = cols["request"].shape[0], cfg.num_experts, cfg.num_layers
    none, zero = np.zeros((n, 0), np.int64), np.zeros(0)
    out = {"tok": none, "bon_tok": zero, "req": none, "bon_req": zero, "prev": np.zeros((n, 0), np.int16),
           "succ": np.zeros((E, 0), np.int64), "bon_lay": zero}
    tok_s = cfg.token_strength * (1.0 - cfg.token_depth_decay * l / max(L - 1, 1))
    if tok_s > 0:
        out.update(tok=np.ascontiguousarray(tok_pref, np.int64), bon_tok=tok_s * _profile(cfg.token_fanout))
    if cfg.request_strength > 0:
        m = cfg.request_fanout
        out.update(req=_hash_experts(salts[1], cols["request"], l, L, m, E),
                   bon_req=cfg.request_strength * _profile(m))
    if cfg.layer_strength > 0 and l > 0:
        out.update(prev=np.ascontiguousarray(experts[:, l - 1]), succ=np.ascontiguousarray(succ[l], np.int64),
                   bon_lay=cfg.layer_strength * _profile(cfg.layer_fanout))
    return out
