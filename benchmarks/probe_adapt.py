"""Does the reuse probe transfer across corpus tasks, and does learning on the served task recover it?

builtin-fine, leave-one-task-out (fitted on four corpus tasks, replayed on the fifth), h100-sxm, 50% budget:
simulated µs per token of LRU, LFU, LIRS, Belady, and fc-evict reading the reuse probe fitted on the training
tasks only (fixed) or also learning on the replayed task as its distances become known (adapting,
predict/reuse_probe.adapting_probe_steps, weight 4). Prints one line per part and the medians with min-max; writes
out/bench/probe_adapt.json. Run: python benchmarks/probe_adapt.py [--quick: the same run] (captures the standard trace on first use).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402

import numpy as np  # noqa: E402
from cache_policies import PREDICTOR, parts  # noqa: E402

from routecast.cache.compare import compare_policies  # noqa: E402
from routecast.cache.forecasts import forecast_sets  # noqa: E402
from routecast.common.bench import table, write_bench  # noqa: E402
from routecast.predict.evaluate import fit_or_load  # noqa: E402
from routecast.predict.reuse_probe import adapting_probe_steps, fit_reuse_probe, probe_steps  # noqa: E402
from routecast.trace.io import read_trace  # noqa: E402
from routecast.trace.standard import standard_trace  # noqa: E402

BASE = ["lru", "lfu", "lirs", "belady"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="accepted for make bench; the full run is already short (~40 s)")
    ap.parse_args()
    trace = read_trace(standard_trace("fine"), mmap=False, load_hidden=True, load_logits=False)
    per = {}
    for name, train, test in parts(trace, "task", 5):
        pred = fit_or_load(PREDICTOR, trace, model=None, seed=0, threads=1, quiet=True, rows=train)
        sets, la = forecast_sets(pred, trace, rows=test)
        got = {}
        for label, reuse in (("fixed", probe_steps(fit_reuse_probe(trace, train), trace, test)),
                             ("adapting", adapting_probe_steps(trace, train, test))):
            pol = ["fc-evict"] + (BASE if label == "fixed" else [])
            for r in compare_policies(trace, budget="50%", hardware="h100-sxm", policies=pol, mask=test,
                                      forecast=sets, layer_ahead=la, reuse=reuse):
                if r["policy"] in pol:
                    got[f"fc-evict [{label} probe]" if r["policy"] == "fc-evict" else r["policy"]] = r["us_per_token"]
        per[name] = got
        print(f"task {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in got.items()), flush=True)
    rows = []
    for k in per[next(iter(per))]:
        v = np.array([per[n][k] for n in per])
        rows.append({"policy": k, "us_per_token": float(np.median(v)), "us_min": float(v.min()), "us_max": float(v.max())})
    rows.sort(key=lambda r: r["us_per_token"])
    non = min((r for r in rows if r["policy"] in ("lru", "lfu", "lirs")), key=lambda r: r["us_per_token"])
    by = {r["policy"]: r for r in rows}
    ada, fix = by["fc-evict [adapting probe]"], by["fc-evict [fixed probe]"]
    head = [f"task mode, 50%, h100-sxm: fc-evict with the adapting probe {ada['us_per_token']:.3f} µs/token, "
            f"{100 * (1 - ada['us_per_token'] / non['us_per_token']):.1f}% faster than {non['policy']} "
            f"{non['us_per_token']:.3f} (fixed probe {fix['us_per_token']:.3f}); medians over 5 held-out tasks"]
    for r in rows:
        head.append(f"{r['policy']}: us_per_token {r['us_per_token']:.3f} (min-max {r['us_min']:.3f}-{r['us_max']:.3f}), "
                    f"{100 * (1 - r['us_per_token'] / non['us_per_token']):+.1f}% vs {non['policy']}")
    print("\nbuiltin-fine, task mode, h100-sxm, 50%: median over 5 held-out tasks\n" + "\n".join(head))
    tasks = [{"task": n, **{k: round(v, 4) for k, v in got.items()}} for n, got in per.items()]
    write_bench("probe_adapt", title="Reuse probe across corpus tasks: fixed vs adapting", headline=head,
                tables=[table("µs per token, median over the 5 held-out tasks (min-max)", rows,
                              note="positive = faster than the best policy without prediction"),
                        table("µs per token per held-out task", tasks)],
                data={"parts": per, "rows": rows}, quick=False)
    print("wrote out/bench/probe_adapt.json")


if __name__ == "__main__":
    main()
