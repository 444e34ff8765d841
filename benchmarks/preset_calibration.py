"""Each synthetic preset's paper statistic vs what the generator measures (the issue's calibration table).

Usage: python benchmarks/preset_calibration.py [--seed 0] [--quick]
Prints a table, writes out/bench/preset_calibration.json, states the machine.
"""

from __future__ import annotations

import argparse
import platform

from routecast.common.bench import table, write_bench
from routecast.trace.synth_presets import calibrate_preset_table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    ap.add_argument("--out", default="out/bench/preset_calibration.json", help="JSON output path")
    ap.add_argument("--quick", action="store_true", help="the same run (it takes seconds); marks the JSON quick")
    a = ap.parse_args()
    rows = calibrate_preset_table(seed=a.seed)
    print(f"machine: {platform.platform()}")
    print(f"{'preset':<22} {'statistic':<46} {'target':>8} {'measured':>9} {'within 10%':>10}")
    for r in rows:
        print(f"{r['preset']:<22} {r['statistic']:<46} {r['target']:>8.4g} {r['measured']:>9.4g} "
              f"{str(r['within_10pct']):>10}")
    head = [f"{sum(r['within_10pct'] for r in rows)}/{len(rows)} presets within 10% of their paper statistic"]
    write_bench("preset_calibration", title="Synthetic presets: the paper statistic each is calibrated to",
                headline=head, tables=[table(f"generator seed {a.seed}", rows)], data={"seed": a.seed},
                quick=a.quick, path=a.out)
    print(head[0])


if __name__ == "__main__":
    main()
