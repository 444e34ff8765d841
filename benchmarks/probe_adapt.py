"""Does the reuse probe transfer across corpus tasks, and does learning on the served task recover it?

builtin-fine, leave-one-task-out (fitted on four corpus tasks, replayed on the fifth), h100-sxm, 50% budget:
simulated µs per token of LRU, LFU, LIRS, Belady, and fc-evict reading the reuse probe fitted on the training
tasks only (fixed) or also learning on the replayed task as its distances become known (adapting,
predict/reuse_probe.adapting_probe_steps: target 1/sqrt(d), cap 256, weight 16). Then what was tried to make the
probe transfer better (the issue-21 task-mode target, 15% faster than the best policy without prediction), each also
under fc-evict+bypass (a miss whose forecast next use is farther than its victim's is read into a staging slot, not
kept): a stronger ridge penalty (lam 100, 1000), router inputs centred on the request's running mean (causal: tokens
up to this one), the fit's target (log d or 1/sqrt(d)), its cap (32, 128, 256 tokens) and the adapting weight (4, 16,
64), the earlier default (log, cap 32, weight 4) among them, lam 3; a forgetting factor (0.99 per refit); a blend
with the nearest served rows (k 8, 0.3); the request position as an input; per-key request history added to that
earlier probe (each key's regression also reads log tokens since the
request last used that key, capped at 64, and the request's decayed count of it, 0.9 per token, both from its earlier
steps; the key-specific weights solved through a Schur complement of the shared block); and, as a ceiling that is not causal, the probe fitted on the held-out task itself. Prints one line per
part, the medians with min-max and the variants' table; writes out/bench/probe_adapt.json.
Run: python benchmarks/probe_adapt.py [--quick: the same run, ~8 min] (captures the standard trace on first use).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402

import numpy as np  # noqa: E402
from cache_policies import PREDICTOR, parts  # noqa: E402

from routecast.cache.compare import compare_policies  # noqa: E402
from routecast.cache.forecasts import forecast_sets  # noqa: E402
from routecast.common.bench import table, write_bench  # noqa: E402
from routecast.predict.evaluate import fit_or_load  # noqa: E402
from routecast.predict.reuse_probe import (  # noqa: E402
    CHUNK_ROWS,
    _add_rows,
    _by_request,
    _features,
    _normal_equations,
    _solve,
    _target,
    _to_log,
    adapting_probe_steps,
    causal_joins,
    fit_reuse_probe,
    probe_steps,
    reuse_distances,
)
from routecast.trace.io import read_trace  # noqa: E402
from routecast.trace.standard import standard_trace  # noqa: E402

BASE = ["lru", "lfu", "lirs", "belady"]
FIXED, ADAPT = "fc-evict [fixed probe]", "fc-evict [adapting probe]"


def bypassed(label: str) -> str:
    """The row of the same probe variant under fc-evict+bypass (a miss it ranks below its victim is not kept)."""
    return label.replace("fc-evict", "fc-evict+bypass", 1)


ADAPT_BP = bypassed(ADAPT)
HISTORY = "fc-evict [adapting probe, log, cap 32, weight 4, + per-key request history]"
CEILING = "fc-evict [probe fitted on the held-out task: not causal, a ceiling]"


def request_centred(trace):
    """The trace with each token's router inputs (T, L, H) minus the mean of its request's inputs at positions up
    to and including its own (what a runtime has when the token reaches each layer)."""
    h = np.asarray(trace.hidden_TLH, np.float64)
    req, pos = np.asarray(trace.tokens["request"]), np.asarray(trace.tokens["position"])
    o = np.lexsort((pos, req))
    rs = req[o]
    cs = np.cumsum(h[o], axis=0)
    starts = np.flatnonzero(np.append(True, rs[1:] != rs[:-1]))
    first = np.repeat(starts, np.diff(np.append(starts, len(rs))))
    before = np.where((first > 0)[:, None, None], cs[np.maximum(first - 1, 0)], 0.0)
    mean = np.empty_like(h)
    mean[o] = (cs - before) / (np.arange(len(rs)) - first + 1)[:, None, None]
    return dataclasses.replace(trace, hidden_TLH=(h - mean).astype(np.float32))


def history_features(trace) -> np.ndarray:
    """(T, K, 2) per token and key: log min(tokens since its request last used the key, 64) and the request's decayed
    count of the key (0.9 per token), both over the request's tokens of earlier steps (a prefill's own tokens are routed layer by layer in its
    step: only earlier steps' routing is all known when a layer of this one is forecast)."""
    s = trace.spec
    K, T = s.num_layers * s.num_experts, trace.num_tokens
    req, pos = np.asarray(trace.tokens["request"]), np.asarray(trace.tokens["position"])
    ex = np.asarray(trace.experts_TLK, np.int64)
    used = np.zeros((T, K), bool)
    ok = ex >= 0
    used[np.broadcast_to(np.arange(T)[:, None, None], ex.shape)[ok],
         (np.arange(s.num_layers)[None, :, None] * s.num_experts + ex)[ok]] = True
    step = np.asarray(trace.step)
    out = np.zeros((T, K, 2))
    prev, last, c, new = -1, np.zeros(K), np.zeros(K), []
    for t in np.lexsort((pos, step, req)):
        if req[t] != prev:
            prev, last, c, new = req[t], np.full(K, -1e9), np.zeros(K), []
        elif step[t] != step[new[0]]:  # the request's tokens of its previous step are all routed now: fold them in
            for u in new:
                last, c = np.where(used[u], pos[u], last), 0.9 * c + used[u]
            new = []
        out[t, :, 0], out[t, :, 1] = np.log(np.minimum(pos[t] - last, 64.0)), c
        new.append(t)
    return out


def history_steps(trace, Z, train, rows, weight=4.0, every=32, cap=32, lam=1.0) -> list[np.ndarray]:
    """adapting_probe_steps with Z's per-key inputs added: log d_k = [h_0..h_l, 1]·w_k + z_k·v_k, one ridge per key
    whose shared block (the router inputs) is inverted once per layer (Schur complement for the J inputs of each key)."""
    hid = np.asarray(trace.hidden_TLH, np.float64)
    s = trace.spec
    L, E, K, J = s.num_layers, s.num_experts, s.num_layers * s.num_experts, Z.shape[2]
    ex = np.asarray(trace.experts_TLK, np.int64)
    S = [[np.zeros((f, f)), np.zeros((f, K)), np.zeros((f, K, J)), np.zeros((K, J, J)), np.zeros((K, J))]
         for f in [(lay + 1) * hid.shape[2] + 1 for lay in range(L)]]

    def add(idx, logd, w):
        z = Z[idx]
        for lay in range(L):
            X = _features(hid[idx], lay)
            S[lay][0] += w * X.T @ X
            S[lay][1] += w * X.T @ logd
            S[lay][2] += w * (X.T @ z.reshape(len(idx), J * K)).reshape(-1, K, J)
            S[lay][3] += w * np.einsum("nki,nkj->kij", z, z, optimize=True)
            S[lay][4] += w * np.einsum("nki,nk->ki", z, logd, optimize=True)

    def solve():
        W = []
        for A, a, B, C, b in S:
            F = len(A)
            Ai = np.linalg.inv(A + lam * np.eye(F))
            Aia, AiB = Ai @ a, (Ai @ B.reshape(F, J * K)).reshape(F, K, J)
            Sm = C + lam * np.eye(J) - np.einsum("fki,fkj->kij", B, AiB, optimize=True)
            v = np.linalg.solve(Sm, (b - np.einsum("fki,fk->ki", B, Aia, optimize=True))[..., None])[..., 0]
            W.append((Aia - np.einsum("fkj,kj->fk", AiB, v, optimize=True), v))
        return W

    def predict(W, r):
        out = np.empty((len(r), L, K), np.float32)
        for lay, (w, v) in enumerate(W):
            out[:, lay] = np.clip(_features(hid[r], lay) @ w + np.einsum("nkj,kj->nk", Z[r], v), 0, np.log(cap))
        return out

    idx, req, pos = _by_request(trace, train)
    logd = np.log(reuse_distances(req, pos, ex[idx], E, cap))
    for a in range(0, len(idx), 4096):
        add(idx[a:a + 4096], logd[a:a + 4096], 1.0)
    W, out = solve(), []
    for last, joins in causal_joins(trace, rows, cap=cap, every=every):  # adapting_probe_steps' causal schedule
        if joins is not None:
            add(joins[0], np.log(joins[1]), weight)
            W = solve()
        out.append(predict(W, last))
    return out


def with_position(trace):
    """The trace with log(1 + position) appended to every layer's router inputs (T, L, H + 1): a request nearer its
    end reuses less before it ends, and the position is known when the token is."""
    h = np.asarray(trace.hidden_TLH, np.float64)
    z = np.log1p(np.asarray(trace.tokens["position"], np.float64))
    hz = np.concatenate([h, np.broadcast_to(z[:, None, None], (*h.shape[:2], 1))], 2).astype(np.float32)
    return dataclasses.replace(trace, spec=dataclasses.replace(trace.spec, hidden_size=hz.shape[2]), hidden_TLH=hz)


def adapting_variant(trace, train, rows, rho=1.0, knn=0, beta=0.0, cap=256, weight=16.0, every=32, lam=1.0,
                     target="inv-sqrt") -> list[np.ndarray]:
    """adapting_probe_steps (its defaults) with, at each refit, the normal equations so far scaled by rho first (a
    forgetting factor: older rows, the training tasks' first, weigh less), and, with knn > 0, each forecast's g(d)
    blended as (1 - beta)·ridge + beta·(mean g(d) of the knn joined rows of the served task nearest by the cosine
    of that layer's router inputs), once 64 rows have joined (the same causal schedule)."""
    hid = np.asarray(trace.hidden_TLH, np.float64)
    unit = hid / (np.linalg.norm(hid, axis=2, keepdims=True) + 1e-9)
    L, K = trace.spec.num_layers, trace.spec.num_layers * trace.spec.num_experts
    xtx, xty = _normal_equations(trace, train, cap, CHUNK_ROWS, target)
    W, out, mem_i, mem_y = _solve(xtx, xty, lam), [], np.zeros(0, np.int64), np.zeros((0, K))
    for last, joins in causal_joins(trace, rows, cap=cap, every=every):
        if joins is not None:
            for a in (*xtx, *xty):
                a *= rho
            _add_rows(xtx, xty, hid[joins[0]], _target(joins[1], target), weight)
            W = _solve(xtx, xty, lam)
            mem_i, mem_y = np.append(mem_i, joins[0]), np.vstack([mem_y, _target(joins[1], target)])
        p = np.empty((len(last), L, K), np.float32)
        for lay, w in enumerate(W):
            y = _features(hid[last], lay) @ w
            if knn and len(mem_i) >= 64:
                near = np.argpartition(-(unit[last, lay] @ unit[mem_i, lay].T), knn - 1, axis=1)[:, :knn]
                y = (1 - beta) * y + beta * mem_y[near].mean(1)
            p[:, lay] = _to_log(y, target, cap)
        out.append(p)
    return out


def variants(trace, centred, positioned, Z, train, test) -> dict[str, list[np.ndarray]]:
    """Each fc-evict row's reuse forecast (one (R, L, K) log d̂ per step of `test`)."""
    def adapting(target, cap, weight):
        return adapting_probe_steps(trace, train, test, target=target, cap=cap, weight=weight)

    return {FIXED: probe_steps(fit_reuse_probe(trace, train), trace, test),
            ADAPT: adapting_probe_steps(trace, train, test),
            "fc-evict [fixed probe, lam 100]": probe_steps(fit_reuse_probe(trace, train, lam=100.0), trace, test),
            "fc-evict [fixed probe, lam 1000]": probe_steps(fit_reuse_probe(trace, train, lam=1000.0), trace, test),
            "fc-evict [fixed probe, request-centred inputs]": probe_steps(fit_reuse_probe(centred, train), centred, test),
            "fc-evict [fixed probe, inv-sqrt, cap 256]": probe_steps(
                fit_reuse_probe(trace, train, cap=256, target="inv-sqrt"), trace, test),
            "fc-evict [adapting probe, log, cap 32, weight 4 (the earlier default)]": adapting("log", 32, 4.0),
            "fc-evict [adapting probe, log, cap 32, weight 16]": adapting("log", 32, 16.0),
            "fc-evict [adapting probe, log, cap 128, weight 4]": adapting("log", 128, 4.0),
            "fc-evict [adapting probe, inv-sqrt, cap 32, weight 4]": adapting("inv-sqrt", 32, 4.0),
            "fc-evict [adapting probe, inv-sqrt, cap 256, weight 4]": adapting("inv-sqrt", 256, 4.0),
            "fc-evict [adapting probe, inv-sqrt, cap 256, weight 64]": adapting("inv-sqrt", 256, 64.0),
            "fc-evict [adapting probe, lam 3]": adapting_probe_steps(trace, train, test, lam=3.0),
            "fc-evict [adapting probe, forgetting 0.99 per refit]": adapting_variant(trace, train, test, rho=0.99),
            "fc-evict [adapting probe, + nearest 8 served rows, blend 0.3]": adapting_variant(trace, train, test, knn=8,
                                                                                        beta=0.3),
            "fc-evict [adapting probe, + log position input]": adapting_probe_steps(positioned, train, test),
            HISTORY: history_steps(trace, Z, train, test),
            CEILING: probe_steps(fit_reuse_probe(trace, test), trace, test)}


def medians(per: dict[str, dict[str, float]], names) -> list[dict]:
    rows = []
    for k in names:
        v = np.array([per[n][k] for n in per])
        rows.append({"policy": k, "us_per_token": float(np.median(v)), "us_min": float(v.min()), "us_max": float(v.max())})
    return sorted(rows, key=lambda r: r["us_per_token"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="accepted for make bench; the full run is already short (~8 min)")
    ap.parse_args()
    trace = read_trace(standard_trace("fine"), mmap=False, load_hidden=True, load_logits=False)
    centred, positioned = request_centred(trace), with_position(trace)
    Z = history_features(trace)
    per = {}
    for name, train, test in parts(trace, "task", 5):
        pred = fit_or_load(PREDICTOR, trace, model=None, seed=0, threads=1, quiet=True, rows=train)
        sets, la = forecast_sets(pred, trace, rows=test)
        got = {r["policy"]: r["us_per_token"] for r in compare_policies(
            trace, budget="50%", hardware="h100-sxm", policies=BASE, mask=test, forecast=sets, layer_ahead=la)}
        for label, reuse in variants(trace, centred, positioned, Z, train, test).items():
            by = {r["policy"]: r["us_per_token"] for r in compare_policies(
                trace, budget="50%", hardware="h100-sxm", policies=["fc-evict", "fc-evict+bypass"], mask=test,
                forecast=sets, layer_ahead=la, reuse=reuse)}
            got[label], got[bypassed(label)] = by["fc-evict"], by["fc-evict+bypass"]
        per[name] = got
        print(f"task {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in got.items()), flush=True)
    main_names = [*BASE, FIXED, ADAPT, ADAPT_BP]
    rows = medians(per, main_names)
    tried = medians(per, [k for k in per[next(iter(per))] if k not in BASE])
    non = min((r for r in rows if r["policy"] in ("lru", "lfu", "lirs")), key=lambda r: r["us_per_token"])
    by = {r["policy"]: r for r in rows + tried}

    def vs(r):
        return 100 * (1 - r["us_per_token"] / non["us_per_token"])

    ada, fix, ceil, abp, cbp = by[ADAPT], by[FIXED], by[CEILING], by[ADAPT_BP], by[bypassed(CEILING)]
    causal = [r for r in tried if r["policy"] not in (CEILING, bypassed(CEILING))]
    best = min(causal, key=lambda r: r["us_per_token"])
    head = [f"task mode, 50%, h100-sxm: fc-evict with the adapting probe {ada['us_per_token']:.3f} µs/token, "
            f"{vs(ada):.1f}% faster than {non['policy']} {non['us_per_token']:.3f} (fixed probe "
            f"{fix['us_per_token']:.3f}); with +bypass {abp['us_per_token']:.3f}, {vs(abp):.1f}% faster; medians over "
            "5 held-out tasks",
            f"best causal probe variant tried: {best['policy']} {best['us_per_token']:.3f} ({vs(best):+.1f}% vs "
            f"{non['policy']}); ceiling, the probe fitted on the held-out task itself (not causal): "
            f"{ceil['us_per_token']:.3f} ({vs(ceil):+.1f}%), with +bypass {cbp['us_per_token']:.3f} ({vs(cbp):+.1f}%)"]
    for r in rows:
        head.append(f"{r['policy']}: us_per_token {r['us_per_token']:.3f} (min-max {r['us_min']:.3f}-{r['us_max']:.3f}), "
                    f"{vs(r):+.1f}% vs {non['policy']}")
    for r in tried:
        r["vs_best_non_predictive_pct"] = round(vs(r), 2)
    print("\nbuiltin-fine, task mode, h100-sxm, 50%: median over 5 held-out tasks\n" + "\n".join(head))
    print("\nprobe variants (median, min-max, vs the best policy without prediction):\n" + "\n".join(
        f"{r['policy']}: {r['us_per_token']:.3f} ({r['us_min']:.3f}-{r['us_max']:.3f}), {vs(r):+.1f}%" for r in tried))
    tasks = [{"task": n, **{k: round(v, 4) for k, v in got.items() if k in main_names}} for n, got in per.items()]
    write_bench("probe_adapt", title="Reuse probe across corpus tasks: fixed vs adapting", headline=head,
                tables=[table("µs per token, median over the 5 held-out tasks (min-max)", rows,
                              note="positive = faster than the best policy without prediction"),
                        table("µs per token per held-out task", tasks),
                        table(f"what was tried to make the probe transfer (µs per token; vs {non['policy']}, the best "
                              "policy without prediction)", tried,
                              note="the rows fitted on the held-out task read its future: ceilings, not policies")],
                data={"parts": per, "rows": rows, "tried": tried}, quick=False)
    print("wrote out/bench/probe_adapt.json")


if __name__ == "__main__":
    main()
