"""routecast's cache replay side by side with moe-policylang's `replay_policies` on identical input.

moe-policylang (PyPI) replays each (layer, prompt) pair on its own: a per-layer cache of
max(top_k, round(N x fraction)) slots, cold at the start of every prompt, one access per token (its top-k
experts, touched one after another), hit rate = hits / (tokens x top_k). Its Belady evicts the cached
expert whose next use (by a later token) is farthest, without streaming. We feed it our trace (each token's
router distribution rebuilt from its top-k ids and weights, so its top-k equals ours) and run routecast's
kernel on the same cells: one single-layer trace per (layer, request), one token per step, a pool of the
same size (`lru` and `belady`), and again with one access per expert in moe-policylang's touch order
(`lru-seq`, `belady-seq`: its access model, where LRU must agree exactly). Expected differences, reported not hidden: routecast computes an access's
hits before fetching its misses, so a miss never evicts an expert the same token still needs (moe-policylang
can, then counts a miss); routecast's Belady may stream a miss without caching it when every cached expert
is needed sooner, which makes it optimal (moe-policylang's can be beaten).

moe-policylang is never a routecast dependency: it runs from its own virtual environment (--peer-venv,
created with `python -m venv` + `pip install --no-deps moe-policylang lark` when missing, reading torch,
numpy and pyarrow from this environment); when it cannot be installed the
benchmark prints why and exits 0 having compared nothing.

Run: python benchmarks/cache_peer.py [--trace DIR] [--peer-venv DIR] [--requests 40] [--quick]
Writes out/bench/cache_peer.json; ends with one line per policy and budget:
`POLICY budget F: routecast X, moe-policylang Y (difference D)`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np

from routecast.cache.replay import ReplayConfig, build_accesses, run_policy
from routecast.common.bench import table, write_bench
from routecast.common.machine import machine_info
from routecast.sim.hardware import load_hardware
from routecast.trace import MoESpec, Trace, make_columns

FRACTIONS = (0.25, 0.5, 0.75)
PEER_CODE = """
import json, sys
from moe_policylang.benchmark.replay import replay_policies
res = replay_policies(sys.argv[1], top_k=int(sys.argv[2]), policies=("topk_lru", "belady"),
                      budget_fractions=(0.25, 0.5, 0.75))
print(json.dumps([{"label": r.label, "budget": r.budget, "frac": r.budget_frac, "hits": r.hits,
                   "accesses": r.accesses} for r in res]))
"""


def peer_python(venv: Path, timeout: float = 1800) -> Path | None:
    """The peer venv's python, creating the venv and installing moe-policylang when missing; None if impossible.

    timeout: seconds the install may take (a machine without a reachable package index fails after it)."""
    py = venv / "bin" / "python"
    probe = [str(py), "-c", "import moe_policylang.benchmark.replay"]
    if py.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return py
    try:
        # Only moe-policylang and lark go into the throwaway venv; its other dependencies (torch, numpy, pyarrow)
        # are read from this environment through a .pth file (seconds instead of a fresh torch download).
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        Path(site, "_routecast_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "moe-policylang", "lark"], check=True,
                       capture_output=True, timeout=timeout)
    except (subprocess.SubprocessError, OSError) as e:
        print(f"moe-policylang could not be installed into {venv} ({type(e).__name__}); nothing compared.")
        return None
    return py if subprocess.run(probe, capture_output=True).returncode == 0 else None


def write_peer_trace(trace: Trace, path: Path) -> None:
    """The trace as moe-policylang's JSON-lines TraceRecording (router distribution rebuilt from top-k)."""
    s = trace.spec
    with open(path, "w") as f:
        f.write(json.dumps({"model_name": s.name or "routecast", "num_layers": s.num_layers, "num_experts": s.num_experts,
                            "top_k": s.top_k, "num_entries": trace.num_tokens * s.num_layers,
                            "records_full_softmax": True}) + "\n")
        for r in np.unique(trace.request):
            idx = np.flatnonzero(trace.request == r)
            idx = idx[np.argsort(trace.position[idx], kind="stable")]
            for t_i, t in enumerate(idx):
                for layer in range(s.num_layers):
                    ids = trace.experts_TLK[t, layer]
                    sm = _rebuilt(ids[None, :], s.num_experts)[0]  # its argpartition picks exactly these ids
                    f.write(json.dumps({"p": int(r), "t": int(t_i), "l": layer, "e": ids.tolist(), "sm": sm.tolist()})
                            + "\n")


def _rebuilt(ids: np.ndarray, E: int) -> np.ndarray:
    """The router distribution handed to moe-policylang for top-k ids (N, K): distinct values on the ids."""
    sm = np.zeros((len(ids), E))
    K = ids.shape[1]
    np.put_along_axis(sm, ids.astype(np.int64), 0.5 + np.arange(K, 0, -1) / (4.0 * K), axis=1)
    return sm


def ours(trace: Trace, frac: float) -> dict[str, tuple[int, int]]:
    """routecast's kernel on moe-policylang's cells: per (layer, request) cold single-layer replays.

    'lru'/'belady': one access per token (its top-k together). 'lru-seq'/'belady-seq': one access per
    expert, in the order moe-policylang touches them (np.argpartition of its distribution), its model.
    """
    s = trace.spec
    budget = max(s.top_k, int(round(s.num_experts * frac)))
    cfg = ReplayConfig(budget=budget, hardware=load_hardware("h100-sxm"))
    tot = {k: [0, 0] for k in ("lru", "belady", "lru-seq", "belady-seq")}
    for r in np.unique(trace.request):
        idx = np.flatnonzero(trace.request == r)
        idx = idx[np.argsort(trace.position[idx], kind="stable")]
        for layer in range(s.num_layers):
            ids = trace.experts_TLK[idx, layer]
            seq = np.argpartition(-_rebuilt(ids, s.num_experts), s.top_k - 1, axis=1)[:, : s.top_k].reshape(-1, 1, 1)
            for tag, ex, k in (("", ids[:, None, :], s.top_k), ("-seq", seq.astype(np.int16), 1)):
                n = len(ex)
                sub = Trace(spec=MoESpec(num_layers=1, num_experts=s.num_experts, top_k=k, expert_bytes=1 << 20),
                            tokens=make_columns(n, request=np.zeros(n), step=np.arange(n)),
                            experts_TLK=ex, weights_TLK=np.ones(ex.shape, np.float32))
                acc = build_accesses(sub)
                for pol in ("lru", "belady"):
                    row = run_policy(acc, pol, cfg, expert_bytes=1 << 20)
                    tot[pol + tag][0] += row["requests"] - row["demand_loads"]
                    tot[pol + tag][1] += len(idx) * s.top_k
    return {k: (v[0], v[1]) for k, v in tot.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=None, help="trace directory (default: the standard trace 'builtin')")
    ap.add_argument("--quick", action="store_true", help="first 10 requests only")
    ap.add_argument("--requests", type=int, default=40, help="first N requests of the trace (moe-policylang is slow)")
    ap.add_argument("--peer-venv", default=str(Path(tempfile.gettempdir()) / "moe-policylang-venv"),
                    help="throwaway virtual environment for moe-policylang (created when missing)")
    ap.add_argument("--out", default="out/bench/cache_peer.json", help="JSON output")
    a = ap.parse_args()
    from routecast.trace.io import read_trace
    from routecast.trace.standard import standard_trace

    if a.trace is None:
        a.trace = standard_trace("builtin")
    if a.quick:
        a.requests = min(a.requests, 10)

    trace = read_trace(a.trace, mmap=False, load_hidden=False, load_logits=False)
    if (trace.experts_TLK < 0).any():
        trace = trace.select(~(trace.experts_TLK < 0).any(axis=(1, 2)))  # moe-policylang has no dropped slots
    keep = np.unique(trace.request)[: a.requests]
    trace = trace.select(np.isin(trace.request, keep))
    py = peer_python(Path(a.peer_venv), timeout=240 if a.quick else 1800)
    if py is None:
        write_bench("cache_peer", title="Cache replay beside moe-policylang", quick=a.quick, path=a.out,
                    headline=["moe-policylang could not be installed; nothing compared"])
        return
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.jsonl"
        write_peer_trace(trace, path)
        out = subprocess.run([str(py), "-c", PEER_CODE, str(path), str(trace.spec.top_k)], capture_output=True,
                             text=True, check=True)
    peer = {(r["label"], round(r["frac"], 2)): (r["hits"], r["accesses"]) for r in json.loads(out.stdout)}
    rows = []
    for frac in FRACTIONS:
        mine = ours(trace, frac)
        for pol, peer_name in (("lru", "topk_lru"), ("lru-seq", "topk_lru"), ("belady", "belady"),
                               ("belady-seq", "belady")):
            h, n = mine[pol]
            ph, pn = peer[(peer_name, frac)]
            rows.append({"policy": pol, "fraction": frac, "routecast_hit": h / n, "peer_hit": ph / pn,
                         "routecast_accesses": n, "peer_accesses": pn})
    print(f"{trace.num_tokens} tokens of {len(keep)} requests, {trace.spec.num_layers} layers x "
          f"{trace.spec.num_experts} experts, top-{trace.spec.top_k}; per-layer caches, cold per prompt")
    print(f"{'policy':<10} {'budget':>6} {'routecast':>10} {'moe-policylang':>15} {'accesses (ours/theirs)':>24}")
    for r in rows:
        print(f"{r['policy']:<10} {r['fraction']:>6.2f} {r['routecast_hit']:>10.4f} {r['peer_hit']:>15.4f} "
              f"{r['routecast_accesses']:>12}/{r['peer_accesses']}")
    head = [f"{r['policy']} budget {r['fraction']:.2f}: routecast {r['routecast_hit']:.4f}, moe-policylang "
            f"{r['peer_hit']:.4f} (difference {r['routecast_hit'] - r['peer_hit']:+.4f})" for r in rows]
    write_bench("cache_peer", title="Cache replay beside moe-policylang on identical input", headline=head,
                tables=[table(f"hit ratio, {trace.num_tokens} tokens of {len(keep)} requests; per-layer caches, "
                              "cold per prompt", rows)], quick=a.quick, path=a.out)
    print(f"machine: {machine_info().get('cpu', '?')}; wrote {a.out}")
    print("\n".join(head))


if __name__ == "__main__":
    main()
