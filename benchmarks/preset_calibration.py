"""Each synthetic preset's paper statistic vs what the generator measures (the issue's calibration table).

Usage: python benchmarks/preset_calibration.py [--seed 0]
Prints a table, writes out/bench/preset_calibration.json, states the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from routecast.trace.synth_presets import calibrate_preset_table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    ap.add_argument("--out", default="out/bench/preset_calibration.json", help="JSON output path")
    a = ap.parse_args()
    t0 = time.perf_counter()
    rows = calibrate_preset_table(seed=a.seed)
    machine = {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count()}
    print(f"machine: {machine}")
    print(f"{'preset':<22} {'statistic':<46} {'target':>8} {'measured':>9} {'within 10%':>10}")
    for r in rows:
        print(f"{r['preset']:<22} {r['statistic']:<46} {r['target']:>8.4g} {r['measured']:>9.4g} "
              f"{str(r['within_10pct']):>10}")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine, "seed": a.seed, "rows": rows,
                               "seconds": time.perf_counter() - t0}, indent=2, default=str))
    print(f"{sum(r['within_10pct'] for r in rows)}/{len(rows)} presets within 10% of their paper statistic")


if __name__ == "__main__":
    main()
