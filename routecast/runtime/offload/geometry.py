"""The I/O-bound regime: MoE layers of a production expert geometry, random bf16 weights, real routing.

``write_weights(folder, geom)`` writes, once, a safetensors file of `geom.layers` MoE layers with that model's
expert geometry (sim/models/NAME.toml: hidden size, expert FFN size, experts, top-k): per layer the fused
``layers.<l>.experts.gate_up_proj`` [E, 2I, H] and ``down_proj`` [E, H, I] in bf16. **The weights are random**
(each bf16 value: random sign and mantissa, exponent fixed so |w| is in [2^-7, 2^-6); no model is claimed); the
layer count is scaled down to fit the disk and the time (stated in every output). The file is streamed expert by
expert, written to a temporary name, fsynced and renamed; a sidecar JSON says what it holds, so a second run reuses it.

``GeometryRun`` drives those layers with **real routing** (geometry_routing.py: the decode tokens of a captured
trace mapped to the geometry's experts, with PROBE's and the reuse probe's forecasts). Each step (one decode token)
accesses every layer's experts through the offload runtime's own ExpertStore (cache/slots.py SlotCache, the replay's
policy objects) and computes the SwiGLU experts from the slots in bf16: the resident ones while the misses are read,
then the misses (StoreConfig.early, as the replay times a layer). The slow tier is the weights file on disk
(tier.DiskTier: O_DIRECT reads on loader threads, experts computed on the CPU) or pinned host memory copied to GPU
slots (gpu.PinnedTier, one tier shared by many runs; experts computed on the GPU). A forecast set of layer g+1 is
prefetched while layer g computes; fc-evict is given each token's request and routing (its request profiles), as in
the runtime, and with ``reuse`` the reuse probe's rows.

``run_geometry`` times the tokens after a warm-up (untimed, its reads drained); ``replay_geometry`` replays the same
accesses through replay_slots (the warm-up prefix replayed alone and subtracted) for the time the replay predicts;
``eviction_bound`` gives LRU, LFU and Belady misses on the routing, the most any eviction rule can save.
"""

from __future__ import annotations

import json
import os
import struct
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from routecast.common.errors import ConfigError
from routecast.common.outputs import write_atomic
from routecast.runtime.offload.expert_kernel import swiglu_round, torch_expert
from routecast.runtime.offload.gpu import sync
from routecast.runtime.offload.store import ExpertStore, StoreConfig
from routecast.runtime.offload.tier import DiskTier, ExpertLayout

GEOMETRIES = ("deepseek-v2-lite", "mixtral-8x7b")
DEFAULT_LAYERS = {"deepseek-v2-lite": 4, "mixtral-8x7b": 2}  # 4.4 GB and 5.6 GB of weights: what this disk holds
WEIGHTS_DIR = Path("out/geometry")  # where `routecast run --geometry` and the benchmark write (and reuse) the weights
WEIGHT_NOTE = "weights are random bf16 (no model), routing is real (the captured builtin-fine trace)"


@dataclass(frozen=True, kw_only=True)
class Geometry:
    """One routed-expert geometry: hidden H, expert FFN I, experts E, top-k K, `layers` MoE layers written."""

    name: str
    hidden: int
    ffn: int
    experts: int
    top_k: int
    layers: int

    @property
    def expert_bytes(self) -> int:
        return 3 * self.hidden * self.ffn * 2

    @property
    def params(self) -> dict[str, tuple[tuple[int, int], torch.dtype]]:
        """One expert's fused tensors as the store holds them: {name: (shape, dtype)} (bf16)."""
        return {"gate_up_proj": ((2 * self.ffn, self.hidden), torch.bfloat16),
                "down_proj": ((self.hidden, self.ffn), torch.bfloat16)}


def geometry(name: str, layers: int | None = None) -> Geometry:
    """The routed-expert geometry of sim/models/NAME.toml with `layers` MoE layers (None: DEFAULT_LAYERS)."""
    from routecast.sim.models import load_model

    if name not in GEOMETRIES:
        raise ConfigError(f"--geometry is {name!r}; expected one of {', '.join(GEOMETRIES)}.")
    layers = DEFAULT_LAYERS[name] if layers is None else layers
    if layers < 1:
        raise ConfigError(f"--geometry-layers is {layers}; expected at least 1.")
    m = load_model(name)
    return Geometry(name=name, hidden=m.hidden_size, ffn=m.expert_ffn, experts=m.num_experts, top_k=m.top_k,
                    layers=layers)


def _random_bf16(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random bf16 bit patterns (uint16): random sign and 7-bit mantissa, exponent 2^-7."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    return (bits & np.uint16(0x807F)) | np.uint16(0x3C00)


def write_weights(folder: str | Path, geom: Geometry, *, seed: int = 0) -> Path:
    """folder/NAME-Llayers.safetensors with geom's random expert weights (written once, reused) -> its path.
    folder is claimed as the running command's output (--weights-dir); a file of that name not written here (no
    sidecar) is refused, never replaced."""
    from routecast.common.outputs import claim, os_error

    folder = claim(folder, "--weights-dir", "dir")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise os_error(e, "--weights-dir", folder) from None
    path = folder / f"{geom.name}-{geom.layers}layers.safetensors"
    meta = {**asdict(geom), "seed": seed, "note": WEIGHT_NOTE, "aligned": 4096}
    side = path.with_suffix(".json")
    if path.is_file() and side.is_file() and json.loads(side.read_text()) == meta:
        return path
    if path.exists() and not side.is_file():  # not ours (ours always has its sidecar): never replaced
        raise ConfigError(f"--weights-dir: {path} exists and was not written by routecast; expected another "
                          "--weights-dir or that file removed.")
    E, H, I = geom.experts, geom.hidden, geom.ffn
    need = geom.layers * E * geom.expert_bytes
    free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize
    if need > free * 0.8:
        raise ConfigError(f"--geometry {geom.name} with {geom.layers} layers needs {need / 1e9:.1f} GB on {folder}; "
                          f"{free / 1e9:.1f} GB are free: expected fewer --geometry-layers.")
    head: dict[str, Any] = {"__metadata__": {"note": WEIGHT_NOTE}}
    off = 0
    for li in range(geom.layers):
        for p, shape in (("gate_up_proj", [E, 2 * I, H]), ("down_proj", [E, H, I])):
            n = int(np.prod(shape)) * 2
            head[f"layers.{li}.experts.{p}"] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
            off += n
    raw = json.dumps(head).encode()
    raw += b" " * (-(8 + len(raw)) % 4096)  # data on a page boundary: every expert is read straight into its slot
    tmp = path.with_name(f".{path.name}.partial")
    rng = np.random.default_rng(seed)
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for _li in range(geom.layers):
            for per in (2 * I * H, H * I):
                for _e in range(E):
                    f.write(_random_bf16(rng, per).tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    write_atomic(side, json.dumps(meta), "--geometry")
    return path


KERNELS = ("numba", "torch")  # a CPU round's expert compute (GeometryRun's kernel)


class GeometryRun:
    """The geometry's layers over an ExpertStore of `budget` slots; ``step(t)`` runs decode token t of the routing."""

    def __init__(self, path: Path | None, geom: Geometry, *, budget: int, policy: str = "lru", loader_threads: int = 4,
                 direct: bool = True, tier=None, early: bool = True, kernel: str = "numba") -> None:
        """path: the weights file (a DiskTier over it is opened and closed with the run); tier: a slow tier shared
        by many runs instead (gpu.PinnedTier: host memory copied to GPU slots; path is then unused). early: each
        layer computes its resident experts while its misses are read (StoreConfig.early, the replay's timing);
        False: once all are in. kernel: a CPU round's expert compute, 'numba' (expert_kernel.py) or 'torch' (bf16
        matmul; a GPU round is always torch)."""
        from routecast.cache.zoo import split_name

        self.geom, self.L, self.E = geom, geom.layers, geom.experts
        self._own_tier = tier is None
        if tier is None:
            self.layout = ExpertLayout([path], [f"layers.{li}" for li in range(geom.layers)], geom.params, geom.experts)
            tier = DiskTier(self.layout, direct=direct)
        self.tier, self.layout = tier, tier.layout
        self.device = getattr(tier, "device", torch.device("cpu"))
        self.store = ExpertStore(self.tier, StoreConfig(budget=budget, loader_threads=loader_threads, policy=policy,
                                                          early=early))
        self.x = torch.randn(1, geom.hidden, generator=torch.Generator().manual_seed(0)).bfloat16().to(self.device)
        self.x32 = self.x[0].float().cpu().numpy()
        if kernel not in KERNELS:
            raise ConfigError(f"--geometry-kernel is {kernel!r}; expected one of {', '.join(KERNELS)}.")
        self.kernel = kernel
        self.outputs: list[np.ndarray] = []  # on the CPU, each layer's output of each token (fp32, H), in order:
        # bit for bit the same for every policy and budget (each slot held the expert it was asked for)
        self.log: list[tuple[int, np.ndarray, np.ndarray]] = []
        self.pred_sets: list[np.ndarray] = []
        self.compute_s: list[float] = []  # seconds per expert computed: a round's time (on a GPU, until its kernels
        # finished) shared evenly by its experts
        self.predict_s = 0.0  # fc-evict's upkeep of its forecasts (begin_step / end_step), as the engine counts it
        self.profiles = split_name(policy)[0] == "fc-evict"  # its request profiles need each step's routing

    def close(self) -> None:
        self.store.close()
        if self._own_tier:
            self.tier.close()

    def _compute(self, w_E: np.ndarray, uniq: np.ndarray, out: dict[str, Any]):
        """The store's compute callback of one layer: on the CPU each expert's weighted output goes to its row of
        out['rows'] (U, H) (the layer's output is their sum in expert order, whatever the rounds); on a GPU the
        outputs add up in out['dev'] there."""
        gu, dn = self.store.pools["gate_up_proj"], self.store.pools["down_proj"]
        on_cpu = self.device.type == "cpu"

        def compute(exps: np.ndarray, slots: np.ndarray) -> None:
            t0 = time.perf_counter()
            rows = np.searchsorted(uniq, exps)
            if on_cpu and self.kernel == "numba":  # expert_kernel.py: fp32 sums of the bf16 weights, 1.2-2.2x torch's
                part = np.empty((len(exps), self.geom.hidden), np.float32)
                swiglu_round(gu, dn, slots, w_E[exps], self.x32, part)
                out["rows"][rows] = part
            else:
                for j, (e, s) in enumerate(zip(exps.tolist(), slots.tolist(), strict=True)):
                    y = torch_expert(gu, dn, s, float(w_E[e]), self.x)
                    if on_cpu:
                        out["rows"][rows[j]] = y[0].numpy()
                    else:
                        out["dev"] = out["dev"] + y
            # one wait per round, not per expert: a GPU's kernels of the round queue back to back (a wait after each
            # expert made every expert pay a launch-and-sync round trip); they must be done before the store unpins
            # the round's slots, which a loader may then refill
            sync(self.device)
            self.compute_s += [(time.perf_counter() - t0) / max(len(exps), 1)] * len(exps)
        return compute

    def step(self, ids_LK: np.ndarray, w_LK: np.ndarray, pred_LE: np.ndarray | None = None, request: int = 0,
             reuse_LK: np.ndarray | None = None, upcoming: list[np.ndarray] | None = None,
             next_use: dict[int, np.ndarray] | None = None) -> None:
        """One decode token of `request`: ids_LK / w_LK its routing per layer; pred_LE bool (L, E) the forecast sets
        of layers 1.. (row g reserves its slots when layer g-1 starts and is read after g-1's demand loads; row 0 is
        never forecast); reuse_LK (L, L·E) the reuse probe's log d̂ for fc-evict (row g read from layer g on);
        upcoming: the server's schedule after this token (cache/reuse.py round_robin) and next_use the forecasts of
        each request's next step from its known input token (cache/reuse.py known_next_use: the waiting requests'
        next turns, this token's own step), for fc-evict."""
        from routecast.cache.reuse import StepUse

        if self.profiles:
            t0 = time.perf_counter()
            self.store.begin_step(np.array([request], np.int64), None, None if reuse_LK is None else reuse_LK[None],
                                  upcoming, next_use)
            self.predict_s += time.perf_counter() - t0
        sets = np.zeros((self.L, self.E), bool)
        for g in range(self.L):
            ok = ids_LK[g] >= 0  # a dropped slot (-1) routes nothing
            uniq, inv = np.unique(ids_LK[g][ok], return_inverse=True)
            if pred_LE is not None and g + 1 < self.L:
                sets[g + 1] = pred_LE[g + 1]
                self.store.prefetch([g + 1], [(g + 1) * self.E + np.flatnonzero(pred_LE[g + 1])], g, hold=True,
                                    running=g * self.E + uniq)
            w_E = np.zeros(self.E, np.float32)
            np.add.at(w_E, ids_LK[g][ok], w_LK[g][ok])
            self.log.append((g, uniq, np.bincount(inv, minlength=len(uniq))))
            out = {"rows": np.zeros((len(uniq), self.geom.hidden), np.float32),
                   "dev": torch.zeros(1, self.geom.hidden, device=self.device)}
            self.store.access(g, uniq, self._compute(w_E, uniq, out))
            if self.device.type == "cpu":  # (a GPU's output stays there: copying it back would wait on every layer)
                self.outputs.append(out["rows"].sum(0))
        t0 = time.perf_counter()
        self.store.end_step(StepUse.from_routing(np.array([request]), ids_LK[None], self.E) if self.profiles else None)
        if self.profiles:
            self.predict_s += time.perf_counter() - t0
        self.pred_sets.append(sets)

    def counters(self) -> dict[str, Any]:
        """The store's and the tier's counters now (figures() of a later moment minus these = that stretch)."""
        return dict(self.store.stats, bytes_read=self.tier.bytes_read, reads=self.tier.reads, read_s=self.tier.read_s,
                    direct_reads=self.tier.direct_reads, computed=len(self.compute_s))

    def figures(self, since: dict[str, Any] | None = None) -> dict[str, Any]:
        """Counters, hit ratio and median compute per expert; since (a counters() snapshot): of the run after it."""
        now = self.counters()
        s = {k: (v - since[k] if since and isinstance(v, int | float) and k != "max_occupied" else v) for k, v in now.items()}
        comp = self.compute_s[since["computed"] if since else 0:]
        asked = s["hits"] + s["misses"]
        s.update(hit_ratio=s["hits"] / max(asked, 1), tier_mode=self.tier.mode,
                 compute_s_per_expert=float(np.median(comp)) if comp else 0.0)
        return s


def forecast_s(routing: dict[str, Any], prefetch: bool, reuse: bool, tokens: bool) -> float:
    """Seconds per token of the forecasts computed before a run from the trace (PROBE's lookahead, the reuse probe,
    the token table), as measured where they ran: charged to the runs and replays that read them."""
    return ((routing["predict_s"] if prefetch else 0.0) + (routing["reuse_s"] if reuse else 0.0)
            + (routing.get("token_s", 0.0) if tokens else 0.0))


def prefetch_sets(routing: dict[str, Any], top: int = 0) -> np.ndarray:
    """bool (T, L, E) the lookahead sets a run prefetches: routing['pred'], or with top > 0 only each token's `top` most
    likely experts of each layer (routing['pred_rank'] 1..top), the confidence gate OffloadConfig.prefetch_top gives
    a model run. In this I/O-bound regime every wrong prefetch is a whole read on the busy tier: the gate keeps the
    forecasts that are right most often (docs/results/offload_geometry_deepseek-v2-lite-lookahead.md: with fc-evict
    at 50%, the whole top-6 read 21.4 experts a token against fc-evict's 15.5 alone, its top-2 15.7)."""
    if top < 0:
        raise ConfigError(f"--prefetch-top is {top}; expected 0 (every forecast expert) or a positive count.")
    if not top:
        return routing["pred"]
    if "pred_rank" not in routing:
        raise ConfigError("--prefetch-top needs the forecast's ranks; this routing holds the sets only (a routing file "
                          "saved before ranks were kept): expected one saved again with --save-routing.")
    return (routing["pred_rank"] > 0) & (routing["pred_rank"] <= top)


def next_token_forecasts(routing: dict[str, Any], policy: str) -> list[dict[int, np.ndarray]] | None:
    """Per token, the forecasts of each request's next step from its known input token that fc-evict reads (cache/
    reuse.py known_next_use over routing['token_use']: the waiting requests' next turns, and the running one's own
    step, in request order too); None for another policy or a routing without them."""
    from routecast.cache.reuse import known_next_use
    from routecast.cache.zoo import split_name

    if split_name(policy)[0] != "fc-evict" or "token_use" not in routing:
        return None
    return known_next_use(routing["request"], routing["token_use"])


def run_geometry(path: Path, geom: Geometry, routing: dict[str, Any], *, budget: int, policy: str = "lru",
                 prefetch: bool = False, loader_threads: int = 4, direct: bool = True, warmup: int = 0,
                 reuse: bool = False, tier=None, early: bool = True, pred_top: int = 0,
                 kernel: str = "numba") -> dict[str, Any]:
    """Every token of `routing` through the geometry's layers at `budget` slots; the first `warmup` tokens fill the
    fast tier untimed (a server runs warm; cold first uses would otherwise dominate a short run) -> figures of the
    timed tokens: s_per_token (wall), hit ratio, bytes read, predictor seconds (the forecasts' measured per-token
    cost, added to the wall time: their matmul ran once before the timed loop; plus fc-evict's upkeep of its
    profiles, timed inside the wall, as the engine counts it); the access log and forecast sets of
    every token (warm-up included) for the replay. reuse: fc-evict reads routing['reuse'] (trace_routing's
    reuse_probe), its measured seconds per token added as the forecast's are. fc-evict also reads the forecasts of the known input
    tokens (the running request's own, the waiting requests' next) when the routing has them (routing['token_use'];
    their seconds added too). tier: a shared
    slow tier (GeometryRun; path unused). A budget of every expert preloads them all (the all-resident floor: no read in the timed run).
    early: GeometryRun's (hits computed while the misses are read; False: once all are in). pred_top: prefetch only
    each token's pred_top most likely experts per layer (prefetch_sets; 0 = the whole forecast). kernel: GeometryRun's
    (a CPU round's expert compute); fig['outputs']: every layer output of the timed tokens on the CPU, (T·L, H)."""
    from routecast.cache.zoo import check_reuse_policy

    n = routing["tokens"]
    if not 0 <= warmup < n:
        raise ConfigError(f"--geometry-warmup is {warmup}; expected 0..{n - 1} (below the {n} tokens driven).")
    if reuse and "reuse" not in routing:
        raise ConfigError("reuse=True on a routing without reuse forecasts; expected trace_routing(reuse_probe=True).")
    if reuse:
        check_reuse_policy(policy)
    r = GeometryRun(path, geom, budget=budget, policy=policy, loader_threads=loader_threads, direct=direct, tier=tier,
                    early=early, kernel=kernel)
    if budget >= geom.layers * geom.experts:
        r.store.preload(np.arange(geom.layers * geom.experts))
    ids, w, pred, req = routing["ids"], routing["w"], prefetch_sets(routing, pred_top), routing["request"]
    ru = routing["reuse"] if reuse else [None] * n
    from routecast.cache.reuse import round_robin

    up = round_robin(req)  # who the server runs next: fc-evict's forecast of a key's next use spans those turns
    nu = next_token_forecasts(routing, policy) or [None] * n
    try:
        for t in range(warmup):
            r.step(ids[t], w[t], pred[t] if prefetch else None, int(req[t]), ru[t], up[t], nu[t])
        r.store.drain()
        since, upkeep0 = r.counters(), r.predict_s
        t0 = time.perf_counter()
        for t in range(warmup, n):
            r.step(ids[t], w[t], pred[t] if prefetch else None, int(req[t]), ru[t], up[t], nu[t])
        wall = time.perf_counter() - t0
    finally:
        r.close()
    fig = r.figures(since)
    timed = n - warmup
    tokens = nu[0] is not None
    pred_s = forecast_s(routing, prefetch, reuse, tokens) * timed
    wall += pred_s  # computed before the run (the trace's forecasts): added; fc-evict's upkeep is inside the wall
    fig.update(wall_s=wall, s_per_token=wall / timed, predict_s=pred_s + r.predict_s - upkeep0, budget=budget, policy=policy,
               prefetch=prefetch, pred_top=pred_top, reuse=reuse, next_tokens=tokens, log=r.log, pred_sets=np.array(r.pred_sets), warmup=warmup, timed_tokens=timed,
               read_s_per_expert=fig["read_s"] / max(fig["reads"], 1), kernel=kernel,
               outputs=np.array(r.outputs[warmup * geom.layers:]) if r.outputs else None)
    return fig


def replay_geometry(fig: dict[str, Any], geom: Geometry, routing: dict[str, Any], *, xfer_s: float,
                    schedule: bool = True, next_tokens: bool = True) -> dict[str, Any]:
    """The replay's prediction of one run_geometry result: its accesses and forecast sets through cache/slots.py
    replay_slots (the same policy object, fc-evict fed each token's request and routing as the run was) with reads of
    xfer_s seconds on one link and the run's measured compute per expert -> {'s_per_token', 'hit_ratio'} of the timed
    tokens (the warm-up prefix replayed alone and subtracted: the decisions do not depend on the clock).
    schedule=False: fc-evict without the server's schedule (each step's own requests only); next_tokens=False: without
    the waiting requests' next-token forecasts (as run_geometry, fc-evict reads them when the routing has them); both
    for comparison."""
    from routecast.cache.reuse import StepUse, round_robin
    from routecast.cache.slots import replay_slots
    from routecast.cache.zoo import split_name
    from routecast.runtime.offload.run import accesses_from_log

    L, E, n, warm = geom.layers, geom.experts, routing["tokens"], fig["warmup"]
    acc = accesses_from_log(fig["log"], L, E, n)
    comp = np.full(len(acc.req_key), fig["compute_s_per_expert"])
    req = np.asarray(routing["request"], np.int64)
    fc = split_name(fig["policy"])[0] == "fc-evict"  # as GeometryRun: its request profiles get each step
    uses = [StepUse.from_routing(req[t:t + 1], routing["ids"][t][None], E) for t in range(n)] if fc else None
    reuse = [routing["reuse"][t][None] for t in range(n)] if fig.get("reuse") else None
    up = round_robin(req) if fc and schedule else None
    nu = next_token_forecasts(routing, fig["policy"]) if up is not None and next_tokens else None

    def replay(steps: int) -> dict[str, Any]:
        cut = int(acc.req_off[steps * L])
        return replay_slots(acc.req_off[:steps * L + 1], acc.req_key[:cut], L, E, fig["budget"], policy=fig["policy"],
                            pred_SLE=fig["pred_sets"][:steps] if fig["prefetch"] else None, layer_ahead=True,
                            req_comp_s=comp[:cut], xfer_s=xfer_s, links=1, requests_S=req[:steps] if fc else None,
                            uses=uses[:steps] if uses else None, reuse=reuse[:steps] if reuse else None,
                            upcoming=up[:steps] if up else None, next_use=nu[:steps] if nu else None)

    full = replay(n)
    pre = replay(warm) if warm else {"sim_s": 0.0, "hits": 0, "misses": 0}
    hits, misses = full["hits"] - pre["hits"], full["misses"] - pre["misses"]
    pred_s = forecast_s(routing, fig["prefetch"], fig.get("reuse", False), nu is not None) * (n - warm)
    return {"s_per_token": (full["sim_s"] - pre["sim_s"] + pred_s) / (n - warm), "hit_ratio": hits / max(hits + misses, 1),
            "hits": hits, "misses": misses}


def routing_log(routing: dict[str, Any]) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """The access log a GeometryRun of `routing` writes, without running it: per token and layer (layer, its distinct
    experts, their token counts); dropped slots (-1) route nothing."""
    ids = routing["ids"]
    return [(g, *np.unique(ids[t, g][ids[t, g] >= 0], return_counts=True))
            for t in range(routing["tokens"]) for g in range(ids.shape[1])]


def eviction_bound(geom: Geometry, routing: dict[str, Any], budget: int) -> dict[str, float]:
    """Misses of LRU, LFU and Belady (the cache kernel, clock-free) on every token of `routing` at `budget` slots:
    in this I/O-bound regime the time follows the reads, so LRU / Belady misses bounds what any eviction rule
    (predicted or not) can gain over LRU, and a prefetch can add at most the compute it overlaps."""
    from routecast.cache.replay import ReplayConfig, run_policy
    from routecast.runtime.offload.run import accesses_from_log
    from routecast.sim.hardware import load_hardware

    acc = accesses_from_log(routing_log(routing), geom.layers, geom.experts, routing["tokens"])
    cfg = ReplayConfig(budget=budget, hardware=load_hardware("h100-sxm"), expert_bytes=geom.expert_bytes)
    return {p: float(run_policy(acc, p, cfg)["demand_loads"]) for p in ("lru", "lfu", "belady")}
