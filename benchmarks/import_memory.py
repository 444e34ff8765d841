"""Claim: `routecast import` (import_jsonl) streams; its peak memory stays flat as the log grows.

Generates forward-hook-style JSON-lines routing logs of two sizes (default 64 and 256 MB; pass
--sizes-mb 100 1000 for the ~1 GB run), imports each in a fresh subprocess, and reports records/s, MB/s
and the subprocess's peak RSS (resource.getrusage ru_maxrss) next to its RSS right after the imports
(the interpreter + numpy + pyarrow floor). Prints a table; writes out/bench/import_memory.json.

The log imitates a vLLM hook on a 16-layer, 64-expert, top-2 model: each forward pass is a batch of
256 tokens (a prompt chunk of one request, or one decode token of each of 256 running requests), logged
layer by layer, so a token's 16 records are spread over ~4k records.

Usage: python benchmarks/import_memory.py [--sizes-mb 64 256] [--seed 0] [--keep DIR] [--shard-tokens 16384] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

L, E, K, BATCH = 16, 64, 2, 256
ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, resource, sys, time
from pathlib import Path
import numpy, pyarrow
from routecast.trace.importers import import_jsonl
from routecast.trace.io import read_trace
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
out = import_jsonl(sys.argv[1], sys.argv[2], shard_tokens=int(sys.argv[3]), progress=False)
dt = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tr = read_trace(out, load_hidden=False, load_logits=False)
print(json.dumps({"seconds": dt, "rss_after_imports_kb": base, "peak_rss_kb": peak, "tokens": tr.num_tokens,
                  "records": tr.provenance["records"],
                  "out_bytes": sum(p.stat().st_size for p in Path(out).iterdir())}))
"""


def generate(path: Path, target_bytes: int, seed: int) -> int:
    """Write a log of about target_bytes; -> number of records."""
    rng = np.random.default_rng(seed)
    hot = rng.dirichlet(np.full(E, 0.3), size=L)  # skewed per-layer expert popularity, as in real MoE routing
    written = records = 0
    request = 0
    decoding: list[tuple[int, int]] = []  # (request, next position) of running requests
    with open(path, "w") as f:
        while written < target_bytes:
            if len(decoding) < BATCH:  # admit a request: its prompt is one forward pass of BATCH tokens
                toks = [(request, p) for p in range(BATCH)]
                decoding.append((request, BATCH))
                request += 1
            else:  # one decode step of every running request
                toks = decoding[:BATCH]
                decoding = [(r, p + 1) for r, p in decoding]
            tid = rng.integers(0, 32000, len(toks))
            for layer in range(L):
                # K distinct experts drawn by popularity: Gumbel top-k, one vectorised draw for the batch
                gumbel = -np.log(-np.log(rng.random((len(toks), E))))
                ids = np.argsort(np.log(hot[layer]) + gumbel, axis=1)[:, :K]
                w = rng.dirichlet(np.ones(K), size=len(toks))
                lines = [f'{{"request": {r}, "layer": {layer}, "token_idx": {p}, "token_id": {t}, '
                         f'"experts": [{", ".join(map(str, i))}], '
                         f'"gating_probs": [{", ".join(f"{x:.5f}" for x in ww)}]}}\n'
                         for (r, p), t, i, ww in zip(toks, tid.tolist(), ids.tolist(), w.tolist(),
                                                     strict=True)]
                chunk = "".join(lines)
                f.write(chunk)
                written += len(chunk)
                records += len(lines)
    return records


def run(sizes_mb: list[int], seed: int, keep: Path | None, shard_tokens: int) -> dict:
    work = Path(keep or tempfile.mkdtemp(prefix="import-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for mb in sizes_mb:
        src = work / f"log-{mb}mb.jsonl"
        t0 = time.perf_counter()
        n = generate(src, mb << 20, seed)
        gen_s = time.perf_counter() - t0
        out = work / f"trace-{mb}mb"
        env = dict(os.environ, OMP_NUM_THREADS="1")
        res = subprocess.run([sys.executable, "-c", CHILD, str(src), str(out), str(shard_tokens)],
                             capture_output=True, text=True, env=env, check=False)
        if res.returncode:
            raise SystemExit(f"import of {src} failed:\n{res.stderr}")
        r = json.loads(res.stdout.strip().splitlines()[-1])
        size = src.stat().st_size
        rows.append({"size_mb": round(size / 2**20, 1), "records": n, "tokens": r["tokens"],
                     "seconds": round(r["seconds"], 2), "records_per_s": round(n / r["seconds"]),
                     "mb_per_s": round(size / 2**20 / r["seconds"], 1),
                     "rss_after_imports_mb": round(r["rss_after_imports_kb"] / 1024, 1),
                     "peak_rss_mb": round(r["peak_rss_kb"] / 1024, 1),
                     "import_overhead_mb": round((r["peak_rss_kb"] - r["rss_after_imports_kb"]) / 1024, 1),
                     "trace_mb": round(r["out_bytes"] / 2**20, 1), "generate_s": round(gen_s, 1)})
        if keep is None:
            src.unlink()
            shutil.rmtree(out)
    if keep is None:
        shutil.rmtree(work)
    return {"claim": "import_jsonl peak memory is flat in the input size (bounded by window + block + shard)",
            "machine": {"platform": platform.platform(),
                        "processor": platform.processor() or platform.machine(),
                        "cpu_count": os.cpu_count(), "python": platform.python_version()},
            "log": {"layers": L, "experts": E, "top_k": K, "tokens_per_forward_pass": BATCH, "seed": seed},
            "import": {"shard_tokens": shard_tokens, "window": 1 << 20, "two_passes": True},
            "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[64, 256],
                    help="log sizes to generate, in MiB")
    ap.add_argument("--seed", type=int, default=0, help="seed of the generated log")
    ap.add_argument("--keep", type=Path, default=None, help="keep the logs and traces in this directory")
    ap.add_argument("--shard-tokens", type=int, default=16384,
                    help="TraceWriter shard size; small enough that every size fills the writer's buffer")
    ap.add_argument("--quick", action="store_true", help="logs of 16 and 64 MiB")
    args = ap.parse_args()
    if args.quick:
        args.sizes_mb = [16, 64]
    res = run(args.sizes_mb, args.seed, args.keep, args.shard_tokens)
    m = res["machine"]
    print(f"machine: {m['platform']}, {m['processor']}, {m['cpu_count']} CPUs, Python {m['python']}")
    cols = ["size_mb", "records", "tokens", "seconds", "records_per_s", "mb_per_s", "rss_after_imports_mb",
            "peak_rss_mb", "import_overhead_mb", "trace_mb"]
    print("  ".join(f"{c:>20s}" for c in cols))
    for r in res["rows"]:
        print("  ".join(f"{r[c]:>20}" for c in cols))
    sys.path.insert(0, str(ROOT))
    from routecast.common.bench import table, write_bench

    lo, hi = res["rows"][0], res["rows"][-1]
    head = [f"import of a {lo['size_mb']:g} MB log: peak RSS {lo['peak_rss_mb']:g} MB; {hi['size_mb']:g} MB log: "
            f"{hi['peak_rss_mb']:g} MB ({hi['records_per_s']:,} records/s)"]
    out = write_bench("import_memory", title="routecast import streams: peak memory against log size", headline=head,
                      tables=[table("one fresh subprocess per log size", [{c: r[c] for c in cols} for r in res["rows"]])],
                      data=res, quick=args.quick, path=ROOT / "out" / "bench" / "import_memory.json")
    print(head[0])
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
