"""`make bench`: run every benchmark script in benchmarks/ in quick mode, from a fresh clone, with no other argument.

Discovers benchmarks/*.py that run as scripts (they hold `if __name__ == "__main__"`; helper modules such as
bad_input_fixtures.py do not), runs each as `python benchmarks/NAME.py --quick` one after another, and writes
out/bench/make_bench.json (wall time and exit status per benchmark) in the shape every benchmark writes, so the
docs render how long the suite took. Standard traces are captured on first use (routecast/trace/standard.py).

    python scripts/run_benchmarks.py [--only a,b] [--skip c] [--timeout 1800]

Exit status: 0 when every benchmark exited 0, else 1 (each failure is named).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def discover() -> list[str]:
    """Names of benchmarks/*.py that run as scripts, sorted."""
    return sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py")
                  if 'if __name__ == "__main__"' in p.read_text(errors="replace"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run every benchmark with --quick; write out/bench/make_bench.json.")
    ap.add_argument("--only", default="", help="comma-separated benchmark names (default: all discovered)")
    ap.add_argument("--skip", default="", help="comma-separated benchmark names to leave out")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds one benchmark may run (default 1800)")
    a = ap.parse_args(argv)
    names = discover()
    if a.only:
        want = a.only.split(",")
        unknown = sorted(set(want) - set(names))
        if unknown:
            print(f"--only {unknown[0]!r} is not a benchmark; expected one of {', '.join(names)}.", file=sys.stderr)
            return 2
        names = [n for n in names if n in want]
    names = [n for n in names if n not in a.skip.split(",")]
    sys.path.insert(0, str(ROOT))
    from routecast.common.bench import table, write_bench

    rows, t_all = [], time.monotonic()
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] python benchmarks/{name}.py --quick", flush=True)
        t0 = time.monotonic()
        try:
            rc = subprocess.run([sys.executable, f"benchmarks/{name}.py", "--quick"], cwd=ROOT, env=env,
                                timeout=a.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        dt = time.monotonic() - t0
        rows.append({"benchmark": name, "wall_s": round(dt, 1), "exit": rc,
                     "json": (ROOT / "out" / "bench" / f"{name}.json").is_file()})
        print(f"[{i}/{len(names)}] {name}: exit {rc} in {dt:.0f} s (load {os.getloadavg()[0]:.1f})", flush=True)
    total = time.monotonic() - t_all
    failed = [r["benchmark"] for r in rows if r["exit"] != 0]
    head = [f"make bench: {len(names)} benchmarks in quick mode took {total / 60:.1f} min of wall time",
            f"{len(names) - len(failed)} exited 0" + (f"; failed: {', '.join(failed)}" if failed else "")]
    os.chdir(ROOT)
    write_bench("make_bench", title="make bench: every benchmark in quick mode", headline=head,
                tables=[table("wall time per benchmark", rows, note="one after another on one machine; "
                                                                     "standard traces captured by the first user")],
                data={"total_s": total}, quick=True)
    print("\n".join(head))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
