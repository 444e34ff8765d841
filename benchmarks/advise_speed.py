"""How long `routecast advise` takes and how much memory it holds, on the built-in fine trace and a DeepSeek-V3 preset.

Issue 23's targets: the builtin-fine trace in under 60 s; a deepseek-v3 preset trace of 2,000 requests (about 11 GB,
synthesised beforehand: standard_trace("deepseek-v3", requests=2000), a few minutes on a quiet machine) in under
10 minutes and under 4 GB. Each advise runs as its own `routecast advise` process (the way a user runs it); wall time
from this script, peak resident memory from the kernel's accounting of that child (getrusage RUSAGE_CHILDREN, read
after each child: the largest child so far). The traces are made on first use (routecast/trace/standard.py).

    python benchmarks/advise_speed.py [--quick] [--requests 2000]

--quick (make bench): the DeepSeek-V3 preset at 16 requests instead of 2,000.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FINE_S, DSV3_S, DSV3_GB = 60.0, 600.0, 4.0  # issue 23's bounds


def _advise(trace: Path, args: list[str]) -> dict:
    """One `routecast advise` child -> wall seconds, peak RSS GB (the largest child so far), exit status, last line."""
    with tempfile.TemporaryDirectory(prefix="advise-speed-") as tmp:
        cmd = [sys.executable, "-m", "routecast.cli", "advise", "--trace", str(trace), *args, "--out", f"{tmp}/out"]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 / 1e9
    if p.returncode != 0:
        raise SystemExit(f"routecast advise on {trace} exited {p.returncode}: {p.stderr.strip()[-400:]}")
    verdict = next((ln for ln in p.stdout.splitlines() if ln.startswith("verdict:")), "")
    return {"wall_s": wall, "peak_rss_gb": rss, "verdict": verdict[:200], "command": "routecast " + " ".join(cmd[3:-2])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the DeepSeek-V3 preset at 16 requests (make bench)")
    ap.add_argument("--requests", type=int, default=None, help="DeepSeek-V3 preset requests (default 2000; 16 quick)")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from routecast.common.bench import table, write_bench
    from routecast.trace.standard import standard_trace

    n = a.requests or (16 if a.quick else 2000)
    fine = standard_trace("fine")
    t0 = time.perf_counter()
    dsv3 = standard_trace("deepseek-v3", requests=n)
    made_s = time.perf_counter() - t0
    gb = sum(f.stat().st_size for f in dsv3.iterdir()) / 1e9
    rows = []
    for name, trace, args, bound_s in (
            ("builtin-fine", fine, ["--model-profile", "builtin-fine", "--hardware", "h100-sxm", "--gpus", "4"], FINE_S),
            (f"deepseek-v3 {n} requests ({gb:.1f} GB)", dsv3,
             ["--model-profile", "deepseek-v3", "--hardware", "h100-sxm", "--gpus", "32", "--ep", "32"], DSV3_S)):
        r = _advise(trace, args)
        rows.append({"trace": name, "wall s": r["wall_s"], "peak RSS GB": r["peak_rss_gb"], "bound s": bound_s,
                     "command": r["command"].replace(str(trace), Path(trace).name)})
        print(f"advise {name}: wall {r['wall_s']:.1f} s, peak RSS {r['peak_rss_gb']:.2f} GB (bound {bound_s:.0f} s)",
              flush=True)
    fine_r, big = rows
    head = [f"advise on builtin-fine: {fine_r['wall s']:.1f} s (target < {FINE_S:.0f} s: "
            f"{'met' if fine_r['wall s'] < FINE_S else 'missed'})",
            f"advise on {big['trace']}: {big['wall s']:.1f} s, peak RSS {big['peak RSS GB']:.2f} GB"
            + (f" (target at 2,000 requests < {DSV3_S / 60:.0f} min and < {DSV3_GB:.0f} GB: "
               f"{'met' if big['wall s'] < DSV3_S and big['peak RSS GB'] < DSV3_GB else 'missed'})" if n >= 2000
               else " (a small preset: the 2,000-request target is measured without --quick)"),
            f"load average {os.getloadavg()[0]:.1f} (2 shared cores); the preset trace "
            + (f"synthesised here in {made_s:.0f} s" if made_s > 1 else "was already made")]
    print("\n".join(head))
    write_bench("advise_speed", title="routecast advise: wall time and peak memory", headline=head,
                tables=[table("advise runs", rows, note="each a separate `routecast advise` process with --out")],
                data={"requests": n, "trace_gb": gb}, quick=a.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
