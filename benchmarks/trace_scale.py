"""Traces larger than memory: synth, stats, predict eval, place compare, cache replay and schedule cocluster on a ~30 GB DeepSeek-V3 trace.

Stage replay: LRU, LFU, Belady over the whole trace; replay-plec: plec-correct (+ LRU, Belady) on the
held-out 20% with the probability predictor's causal forecast.

Each command runs in its own child process through the real CLI (`routecast ...`), and the child reports
its own peak resident set (resource.getrusage(RUSAGE_SELF).ru_maxrss: anonymous and file-backed pages,
memory-mapped shards included), wall time and CPU time (user + system: on a shared, oversubscribed
machine the wall time mostly measures waiting for a core). Printed per command and size:
    COMMAND: N GB in S s (C s CPU), peak RSS R GB
then, per command, the time ratio of the large to the small trace against their size ratio (linear time:
the two ratios agree). Targets (issue 10): peak RSS <= 4 GB for every command; time linear in size.

Sizes are GB of trace on disk (routing shards + token columns); tokens = GB / 2821 bytes (DeepSeek-V3:
58 layers x top-8 x (int16 id + float32 weight) + 37 bytes of token columns). Stages can run separately
(--stages), results merge into the JSON, so a slow synthesis is not repeated. Scratch traces are deleted
at the end unless --keep.

--tile N: the largest trace is not synthesised but written as N copies of the trace N times smaller,
each copy's request ids, steps and arrival times shifted past the previous copy's (stage "tile", timed
like the others). Use it where synthesising the large trace takes too long on a shared machine; the table says so.

Stage "cocluster" runs `schedule cocluster --method M` (--cocluster-method, default smoe): the fit sees its
--max-tokens sample of whole training requests (default 262,144 tokens), the scoring streams the whole trace;
"none" (plain EP: no fit) times only the data path.

Usage: nice -n 5 python benchmarks/trace_scale.py --gb 3 30 --scratch DIR   (or --quick: 0.05 and 0.2 GB)
       [--stages synth,tile,stats,eval,compare,replay,replay-plec,cocluster] [--tile N] [--keep]
       [--out out/bench/trace_scale.json] [--cocluster-method smoe]
       [--merge OTHER.json ...]   (--stages "" --merge ...: only print the merged table of earlier runs)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

BYTES_PER_TOKEN = 58 * 8 * (2 + 4) + 37
STAGES = ("synth", "tile", "stats", "eval", "compare", "replay", "replay-plec", "cocluster")


def _commands(trace: Path, tokens: int, scratch: Path, cocluster: str = "smoe") -> dict[str, list[str]]:
    return {
        "synth": ["synth", "--preset", "deepseek-v3", "--tokens", str(tokens), "--seed", "0", "--out", str(trace)],
        "stats": ["stats", str(trace), "--ep", "8", "--json"],
        "eval": ["predict", "eval", str(trace), "--predictors", "distribution,probability",
                 "--quiet", "--json"],
        "compare": ["place", "compare", "--trace", str(trace), "--ep", "32", "--hardware", "h100-sxm",
                    "--out", str(scratch / f"compare-{trace.name}")],
        "replay": ["cache", "replay", str(trace), "--budget", "50%", "--policies", "lru,lfu,belady", "--quiet",
                   "--out", str(scratch / f"replay-{trace.name}.json")],  # its temporary files go to scratch too
        # PLEC with a forecast: the predictor fitted on 80% of the requests, forecasts on the rest (bit-packed
        # on disk), every policy replayed on those held-out rows.
        "replay-plec": ["cache", "replay", str(trace), "--budget", "50%", "--policies", "plec-correct",
                        "--predictor", "probability", "--quiet", "--out", str(scratch / f"replay-plec-{trace.name}.json")],
        "cocluster": ["schedule", "cocluster", str(trace), "--ep", "8", "--method", cocluster, "--quiet", "--json",
                      "--out", str(scratch / f"cocluster-{trace.name}.json")],
    }


def tile(src: str, dst: str, copies: int) -> int:
    """Write `copies` copies of trace src to dst, shard by shard (ids, steps, arrivals shifted per copy)."""
    import numpy as np

    from routecast.trace.io import TraceWriter, read_trace

    tr = read_trace(src)
    tok = tr.tokens
    shift = {"request": int(tok["request"].max()) + 1, "step": int(tok["step"].max()) + 1,
             "arrival_s": float(tok["arrival_s"].max()) + 1.0}
    prov = dict(tr.provenance, tiled_from=str(src), copies=copies)
    with TraceWriter(dst, tr.spec, task_names=tr.task_names, source_names=tr.source_names, provenance=prov,
                     shard_tokens=1 << 30) as w:
        for c in range(copies):
            for _, ch in tr.chunks(1 << 30):  # one shard at a time
                cols = {k: (v + np.asarray(c * shift[k], v.dtype)) if k in shift else v for k, v in ch.tokens.items()}
                w.append(cols, ch.experts_TLK, ch.weights_TLK)
                w.flush()
    return 0


def child(argv: list[str]) -> None:
    """Run one routecast command in this process; print its wall time and own peak RSS as JSON last."""
    from routecast.cli import main

    if argv[0] == "tile":
        main = lambda args: tile(args[1], args[2], int(args[3]))  # noqa: E731 - same harness, not a CLI command
    t0 = time.perf_counter()
    with open(os.devnull, "w") as sink:
        old, sys.stdout = sys.stdout, sink  # the command's table is not the benchmark's output
        try:
            rc = main(argv)
        finally:
            sys.stdout = old
    wall = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_SELF)  # ru_maxrss in KiB on Linux
    print(json.dumps({"rc": rc, "seconds": wall, "cpu_seconds": ru.ru_utime + ru.ru_stime,
                      "peak_rss_gb": ru.ru_maxrss * 1024 / 1e9}))


def _num_tokens(trace: Path) -> int:
    return int(json.loads((trace / "trace.json").read_text())["num_tokens"])


def run(stage: str, argv: list[str]) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    load0 = os.getloadavg()[0]
    p = subprocess.run([sys.executable, __file__, "--child", *argv], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"{stage} failed (exit {p.returncode}): {p.stderr.strip()[-2000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["load"] = [load0, os.getloadavg()[0]]  # 1-minute load average before and after: the machine is shared
    return r


def _prev(path: Path) -> dict:
    """An earlier run's results (rows by stage@GB) from its benchmark JSON."""
    doc = json.loads(path.read_text())
    return dict(doc.get("data", doc))


def _write(out: Path, res: dict, head: list[str], quick: bool) -> None:
    from routecast.common.bench import table, write_bench

    rows = [{"stage": k.split("@")[0], "GB": r["gb"], "tokens": r.get("tokens"), "wall s": r["seconds"],
             "CPU s": r.get("cpu_seconds"), "peak RSS GB": r["peak_rss_gb"]} for k, r in sorted(res["rows"].items())]
    write_bench("trace_scale", title="Traces larger than memory: peak RSS and time against trace size",
                headline=head, tables=[table("every command on each trace size (own child process)", rows)],
                data=res, quick=quick, path=out)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, nargs="+", default=[3.0, 30.0], help="trace sizes in GB (small, large)")
    ap.add_argument("--scratch", default="out/scratch/trace_scale",
                    help="directory for the traces (deleted at the end unless --keep; default out/scratch/trace_scale)")
    ap.add_argument("--quick", action="store_true", help="sizes 0.05 and 0.2 GB instead of --gb; "
                                                          "cocluster --method none")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {','.join(STAGES)}")
    ap.add_argument("--keep", action="store_true", help="keep the traces (to run later stages separately)")
    ap.add_argument("--tile", type=int, default=0, help="write the largest size as N copies of the size N times smaller")
    ap.add_argument("--out", default="out/bench/trace_scale.json", help="JSON output (merged with an existing one)")
    ap.add_argument("--merge", nargs="*", default=[], help="JSON outputs of other runs (run in parallel) to merge in")
    ap.add_argument("--cocluster-method", default="smoe", help="stage cocluster's --method (none: the data path only)")
    a = ap.parse_args()
    if a.quick:  # small sizes; cocluster times its data path only (the smoe fit is benchmarks/smoe.py's)
        a.gb, a.cocluster_method = [0.05, 0.2], "none"

    stages = [s for s in a.stages.split(",") if s]
    scratch = Path(a.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    out = Path(a.out)
    res = _prev(out) if out.is_file() and not a.quick else {}
    rows = res.setdefault("rows", {})
    for other in a.merge:
        rows.update(_prev(Path(other)).get("rows", {}))
    for gb in a.gb:
        tokens = int(gb * 1e9 / BYTES_PER_TOKEN)
        trace = scratch / f"dsv3-{gb:g}gb"
        cmds = _commands(trace, tokens, scratch, a.cocluster_method)
        small = scratch / f"dsv3-{gb / max(a.tile, 1):g}gb"  # --tile N: the trace N times smaller
        cmds["tile"] = ["tile", str(small), str(trace), str(a.tile)]
        for st in stages:
            tiled = a.tile > 1 and gb == max(a.gb)
            if (st == "synth" and tiled) or (st == "tile" and not tiled):
                continue
            if st in ("synth", "tile") and trace.exists():
                shutil.rmtree(trace)
            r = run(st, cmds[st])
            r["gb"] = sum(f.stat().st_size for f in trace.iterdir()) / 1e9 if trace.is_dir() else gb
            rows[f"{st}@{gb:g}"] = r
            r["tokens"] = _num_tokens(trace) if (trace / "trace.json").is_file() else tokens
            print(f"{st} ({' '.join(cmds[st][:2])}): {r['gb']:.1f} GB in {r['seconds']:.0f} s "
                  f"({r['cpu_seconds']:.0f} s CPU), peak RSS {r['peak_rss_gb']:.2f} GB, load {r['load'][0]:.1f}-"
                  f"{r['load'][1]:.1f}", flush=True)
            _write(out, res, [], a.quick)
    # The whole table so far (this run and earlier ones merged from the JSON), then linearity per command.
    sizes = sorted({float(k.split("@")[1]) for k in rows})
    head = []
    for st in STAGES:
        for gb in sizes:
            r = rows.get(f"{st}@{gb:g}")
            if r:
                cpu = f" ({r['cpu_seconds']:.0f} s CPU)" if "cpu_seconds" in r else ""
                cpu += f", load {r['load'][0]:.1f}-{r['load'][1]:.1f}" if "load" in r else ""
                print(f"{st.upper()}: {r['gb']:.1f} GB in {r['seconds']:.0f} s{cpu}, peak RSS {r['peak_rss_gb']:.2f} GB")
    for st in STAGES:
        have = [gb for gb in sizes if f"{st}@{gb:g}" in rows]
        for lo, hi in zip(have, have[1:], strict=False):
            r0, r1 = rows[f"{st}@{lo:g}"], rows[f"{st}@{hi:g}"]
            cpu = (f", CPU ratio {r1['cpu_seconds'] / r0['cpu_seconds']:.1f}x"
                   if r0.get("cpu_seconds") and r1.get("cpu_seconds") else "")
            head.append(f"{st}: time ratio {r1['seconds'] / r0['seconds']:.1f}x{cpu} for size ratio "
                        f"{r1['gb'] / r0['gb']:.1f}x ({lo:g} -> {hi:g} GB); peak RSS {r0['peak_rss_gb']:.2f} -> "
                        f"{r1['peak_rss_gb']:.2f} GB")
            print(head[-1])
    if any(k.startswith("tile@") for k in rows):
        head.append("tile: the largest trace is copies of the smallest synthesised one (--tile), not a synthesis")
        print(head[-1])
    _write(out, res, head, a.quick)
    if not a.keep:
        for gb in a.gb:
            shutil.rmtree(scratch / f"dsv3-{gb:g}gb", ignore_errors=True)
            shutil.rmtree(scratch / f"compare-dsv3-{gb:g}gb", ignore_errors=True)
            for f in scratch.glob(f"cocluster-dsv3-{gb:g}gb*.json"):
                f.unlink()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
