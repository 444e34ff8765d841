"""Cost of the trace invariant checks that run on every read (routecast/trace/checks.py), at DeepSeek-V3 geometry.

A trace of --tokens tokens (58 MoE layers, 256 experts, top-8, distinct experts per token) is written once
under --dir in --shards shards, rows in step order as a server would log them (decode steps interleave the
running requests). Measured, best of --repeat runs each, on one core:
- read: read_trace of the whole trace (tokens.parquet, memory-mapped shards, concatenation, validation);
- checks, one by one: token columns (>= 0, per-request causal step order), routing ids + distinct top-k +
  weights (check_ids_and_weights), and the checks the previous release ran (ids min/max and
  np.isfinite(weights).all()) as the baseline, on the same arrays;
- hidden: check_finite throughput on a float16 hidden_TLH of --hidden-tokens tokens (H = 7168), in GB/s,
  against float16 min/max (best of 3: it is slow).
- verify: a lazy read_trace + verify_trace (every shard mapped once: value checks + CRC-32, as `inspect` and
  every scan do) against the same pass with the value checks of a CRC-matching shard skipped (what the
  reader did before issue 20); interleaved, --repeat rounds, best and median of each.
The table quotes each check's share of the read and the new routing scan against the previous one.

Usage: python benchmarks/trace_checks.py [--tokens 262144] [--shards 4] [--repeat 5] [--dir DIR]
Writes out/bench/trace_checks.json.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import routecast.trace.io as trace_io  # noqa: E402
from routecast.common.bench import table, write_bench  # noqa: E402
from routecast.common.machine import machine_info  # noqa: E402
from routecast.trace import MoESpec, Trace, make_columns  # noqa: E402
from routecast.trace.checks import check_finite, check_ids_and_weights, check_nonneg, check_request_order  # noqa: E402
from routecast.trace.io import read_trace, verify_trace, write_trace  # noqa: E402
from routecast.trace.lazy import crc32_of  # noqa: E402

SPEC = MoESpec(num_layers=58, num_experts=256, top_k=8, name="deepseek-v3-geometry")


def build(T: int, seed: int = 0) -> Trace:
    """T tokens: 64 running requests, 512-token prompts prefilled one request per step, then decode steps
    of one token per running request; experts (start + 31 k) mod 256 are distinct for k < 8."""
    rng = np.random.default_rng(seed)
    R, P = 64, 512
    D = max(1, T // R - P)
    req = np.repeat(np.arange(R), P + D)
    pos = np.tile(np.arange(P + D), R)
    step = np.where(pos < P, req, R + pos - P)
    o = np.lexsort((req, step))[:T]
    L, E, K = SPEC.num_layers, SPEC.num_experts, SPEC.top_k
    start = rng.integers(0, E, (len(o), L, 1))
    ex = ((start + 31 * np.arange(K)) % E).astype(np.int16)
    w = rng.random((len(o), L, K), dtype=np.float32)
    w /= w.sum(-1, keepdims=True)
    cols = make_columns(len(o), request=req[o], position=pos[o], step=step[o], phase=(pos[o] >= P).astype(np.int8))
    return Trace(spec=SPEC, tokens=cols, experts_TLK=ex, weights_TLK=w)


def best(fn, repeat: int) -> tuple[float, float]:
    """(best, worst) seconds of repeat calls."""
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), max(ts)


def previous_checks(e: np.ndarray, w: np.ndarray) -> None:
    """The routing checks of the previous release: one min/max over ids, np.isfinite over all weights."""
    lo, hi = int(e.min()), int(e.max())
    assert lo >= -1 and hi < SPEC.num_experts and np.isfinite(w).all()


class _SkipValuesOnMatchingCRC:
    """The reader before issue 20: a shard whose CRC-32 matched skipped Trace.validate (the value checks)."""

    def __init__(self) -> None:
        self.real = trace_io.Trace.validate

    def __enter__(self) -> None:
        real = self.real

        def validate(ns, where: str = "trace") -> None:
            if not where.endswith(".safetensors"):
                real(ns, where)  # the whole-trace checks (shapes, token columns) still ran

        trace_io.Trace.validate = validate

    def __exit__(self, *exc) -> None:
        trace_io.Trace.validate = self.real


def verify_arms(path: Path, repeat: int) -> dict[str, list[float]]:
    """Seconds of read_trace + verify_trace (lazy) with and without the value checks, interleaved."""
    ts: dict[str, list[float]] = {"checked": [], "skipped": []}
    for _ in range(repeat):
        for arm in ("skipped", "checked"):
            t0 = time.perf_counter()
            if arm == "checked":
                verify_trace(read_trace(path))
            else:
                with _SkipValuesOnMatchingCRC():
                    verify_trace(read_trace(path))
            ts[arm].append(time.perf_counter() - t0)
    return ts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=262144)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--hidden-tokens", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=None, help="scratch directory for the trace (deleted afterwards)")
    ap.add_argument("--out", default="out/bench/trace_checks.json")
    ap.add_argument("--quick", action="store_true", help="65536 tokens, 3 repeats (make bench)")
    a = ap.parse_args()
    if a.quick:
        a.tokens, a.repeat = 65536, 3
    scratch = Path(tempfile.mkdtemp(prefix="trace_checks-", dir=a.dir))
    try:
        tr = build(a.tokens)
        T = tr.num_tokens
        path = write_trace(tr, scratch / "t", shard_tokens=-(-T // a.shards))
        del tr
        read_s = best(lambda: read_trace(path), a.repeat)
        arms = verify_arms(path, a.repeat)
        crc_s = best(lambda: [crc32_of(np.memmap(f, np.uint8, mode="r")) for f in sorted(path.glob("routing-*"))],
                     a.repeat)
        t = read_trace(path)
        tok, e, w = t.tokens, t.experts_TLK, t.weights_TLK

        def tokens_check() -> None:
            for c in ("request", "position", "step"):
                check_nonneg(tok[c], c, "bench")
            check_request_order(tok["request"], tok["position"], tok["step"], "bench")

        rows = {
            "read_trace (all checks included)": read_s,
            "token columns: >= 0 + causal step order": best(tokens_check, a.repeat),
            "routing: ids + distinct top-k + weights": best(
                lambda: check_ids_and_weights(e, w, SPEC.num_experts, "bench"), a.repeat),
            "routing, previous release: ids min/max + isfinite(weights)": best(
                lambda: previous_checks(e, w), a.repeat),
        }
        h = np.random.default_rng(1).standard_normal((a.hidden_tokens, SPEC.num_layers, 7168), np.float32)
        h = h.astype(np.float16)
        hid_s = best(lambda: check_finite(h, "hidden_TLH", "bench", "finite"), a.repeat)
        # baseline: float reductions (min/max propagate NaN), as the routing weights are checked
        hid_old = best(lambda: bool(np.isfinite(h.min()) and np.isfinite(h.max())), min(3, a.repeat))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    slots = T * SPEC.num_layers * SPEC.top_k
    read_best = read_s[0]
    routing_bytes = e.nbytes + w.nbytes
    print(f"trace: {T} tokens x {SPEC.num_layers} layers x top-{SPEC.top_k} = {slots / 1e6:.1f} M slots, "
          f"{routing_bytes / 2**20:.0f} MiB of routing data in {a.shards} shards; best (worst) of {a.repeat}")
    print(f"{'what':<60} {'s':>16} {'% of read':>10}")
    for k, (b, wst) in rows.items():
        print(f"{k:<60} {b:>7.3f} ({wst:.3f}) {100 * b / read_best:>9.1f}%")
    new, old = rows["routing: ids + distinct top-k + weights"][0], rows[
        "routing, previous release: ids min/max + isfinite(weights)"][0]
    print(f"routing scan, new / previous: {new / old:.2f}x")
    chk, skp = (float(np.median(arms[k])) for k in ("checked", "skipped"))
    extra = chk - skp
    head = [f"value checks on every shard, CRC matching or not: lazy read + verify {chk:.3f} s vs {skp:.3f} s with "
            f"them skipped on a matching CRC (median of {a.repeat}, interleaved): +{extra:.3f} s = "
            f"{100 * extra / skp:.1f}% of a full read (open, map every shard, CRC-32)",
            f"CRC-32 alone over the shards: {crc_s[0]:.3f} s (best of {a.repeat})"]
    for line in head:
        print(line)
    gbs, gbs_old = h.nbytes / hid_s[0] / 1e9, h.nbytes / hid_old[0] / 1e9
    print(f"hidden_TLH finite check (float16, {h.nbytes / 2**20:.0f} MiB): {gbs:.2f} GB/s on the bits vs "
          f"{gbs_old:.2f} GB/s with float16 min/max ({gbs / gbs_old:.0f}x)")
    out = {"machine": machine_info(), "tokens": T, "spec": SPEC.to_dict(), "shards": a.shards, "repeat": a.repeat,
           "rows": {k: {"best_s": b, "worst_s": wst} for k, (b, wst) in rows.items()},
           "routing_new_over_previous": new / old, "hidden_check_GBps": gbs,
           "hidden_minmax_GBps": gbs_old}
    out["verify_s"] = arms
    out["crc_only_s"] = crc_s[0]
    rows_t = [{"what": k, "best_s": b, "worst_s": wst, "pct_of_read": 100 * b / read_best} for k, (b, wst) in rows.items()]
    rows_t += [{"what": f"lazy read + verify, value checks {k}", "best_s": min(v), "worst_s": max(v),
                "pct_of_read": 100 * float(np.median(v)) / read_best} for k, v in arms.items()]
    write_bench("trace_checks", title="Cost of the trace value checks on every read", headline=head,
                tables=[table(f"{T} tokens, DeepSeek-V3 geometry, {a.shards} shards", rows_t)], data=out,
                quick=a.tokens < 262144, path=a.out)
    print(f"machine: {out['machine']['cpu']}, {out['machine']['cpus']} cpus; load {os.getloadavg()[0]:.1f}; "
          f"wrote {a.out}")


if __name__ == "__main__":
    main()
