"""What background expert reads cost the forward pass: loader threads against reader processes.

    python benchmarks/reader_interference.py [--steps 200] [--rounds 5] [--per-step 3]

The built-in model (all experts resident) decodes `--steps` one-token forwards alone, then again while an
offload store over its checkpoint (runtime/offload/store.py, 16 slots, 2 readers, O_DIRECT) prefetches `--per-step`
random experts of a random layer at every step, with the reads on loader threads of this process
(--reader threads) or in reader processes (--reader process, runtime/offload/reader.py). The store's bookkeeping is
the same in both; only who reads differs. Prints, per configuration, the loop's wall (median over interleaved
rounds, min-max), the time inside the store's calls, the forwards' own time (the wall less those calls) and its
ratio to the loop alone, the reads done and the forward time lost per read; writes
out/bench/reader_interference.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from routecast.common import numbers as N  # noqa: E402
from routecast.common.bench import table, write_bench  # noqa: E402
from routecast.common.errors import ConfigError  # noqa: E402
from routecast.runtime.offload.engine import OffloadConfig, OffloadedModel  # noqa: E402
from routecast.runtime.offload.load import load_without_experts, model_path  # noqa: E402
from routecast.runtime.offload.run import SWITCH_S  # noqa: E402
from routecast.trace.capture_arch import spec_from_model  # noqa: E402
from routecast.trace.capture_inputs import load_model  # noqa: E402


def loop(model, ids: torch.Tensor, steps: int, store=None, rng=None, per_step: int = 0, L: int = 0,
         E: int = 0) -> tuple[float, float]:
    """-> (wall seconds, seconds inside the store's calls)."""
    t0 = time.perf_counter()
    in_store = 0.0
    with torch.no_grad():
        for _ in range(steps):
            if store is not None:
                t1 = time.perf_counter()
                layer = int(rng.integers(L))
                keys = layer * E + rng.choice(E, size=per_step, replace=False)
                store.prefetch([layer], [keys], current_layer=layer - 1)
                in_store += time.perf_counter() - t1
            model(ids)
            if store is not None:
                t1 = time.perf_counter()
                store.end_step()
                in_store += time.perf_counter() - t1
    return time.perf_counter() - t0, in_store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin-fine")
    ap.add_argument("--steps", type=N.positive(100_000), default=200)
    ap.add_argument("--rounds", type=N.positive(1000), default=5)
    ap.add_argument("--per-step", type=N.positive(4096), default=3, help="experts prefetched per forward step (at most "
                    "the model's experts per layer)")
    a = ap.parse_args()
    try:
        run(a)
    except ConfigError as e:  # a bad --model or --per-step: one sentence, exit 2
        print(f"benchmarks/reader_interference.py: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def run(a: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    sys.setswitchinterval(SWITCH_S)  # as the runtime runs its loader threads
    t_start = time.time()
    model, _tok = load_model(a.model)
    E = spec_from_model(model).num_experts
    if a.per_step > E:
        raise ConfigError(f"--per-step is {a.per_step}; expected at most {E}, the experts of one layer of {a.model}.")
    ids = torch.randint(0, 200, (1, 1))
    loop(model, ids, 20)
    runs: dict[str, list[tuple[float, float, int]]] = {"alone": [], "threads": [], "process": []}
    loads = [os.getloadavg()[0]]
    for rnd in range(a.rounds):
        order = ["alone", "threads", "process"] if rnd % 2 == 0 else ["process", "threads", "alone"]
        for name in order:
            if name == "alone":
                runs[name].append((*loop(model, ids, a.steps), 0))
                continue
            shell, _ = load_without_experts(a.model)
            off = OffloadedModel(shell, model_path(a.model), OffloadConfig(budget=16, reader=name))
            try:
                rng = np.random.default_rng(rnd)
                wall, in_store = loop(model, ids, a.steps, off.store, rng, a.per_step, off.L, off.E)
                off.store.drain()
                runs[name].append((wall, in_store, off.tier.reads))
            finally:
                off.close()
            loads.append(os.getloadavg()[0])
    base = [w for w, _, _ in runs["alone"]]
    rows = []
    for name, rs in runs.items():
        walls = [w for w, _, _ in rs]
        fwd = [w - s_ for w, s_, _ in rs]  # the forwards' own time: the wall less the store's calls
        ratios = [f / b for f, b in zip(fwd, base, strict=True)]
        reads = statistics.median([n for _, _, n in rs])
        lost = [(f - b) / n * 1e6 for f, (_, _, n), b in zip(fwd, rs, base, strict=True) if n]
        rows.append({"config": name, "wall_s": statistics.median(walls), "store_s": statistics.median([s_ for _, s_, _ in rs]),
                     "forward_s": statistics.median(fwd), "forward_min": min(fwd), "forward_max": max(fwd),
                     "x_alone": statistics.median(ratios), "x_alone_min": min(ratios), "x_alone_max": max(ratios),
                     "reads": reads, "us_lost_per_read": statistics.median(lost) if lost else None})
    print(f"{a.steps} one-token forwards of {a.model}; {a.per_step} experts prefetched per step; "
          f"{a.rounds} interleaved rounds")
    print("config | wall s | in the store's calls s | forwards s (min-max) | forwards x alone (min-max) | reads | "
          "forward µs lost per read")
    for r in rows:
        lost = "–" if r["us_lost_per_read"] is None else f"{r['us_lost_per_read']:.0f}"
        print(f"{r['config']} | {r['wall_s']:.3f} | {r['store_s']:.3f} | {r['forward_s']:.3f} ({r['forward_min']:.3f}-"
              f"{r['forward_max']:.3f}) | {r['x_alone']:.2f} ({r['x_alone_min']:.2f}-{r['x_alone_max']:.2f}) | "
              f"{r['reads']:.0f} | {lost}")
    th, pr = rows[1], rows[2]
    headline = [f"{a.steps} one-token forwards of {a.model} with {a.per_step} expert reads per step in the background: "
                f"the forwards' time with loader threads {th['x_alone']:.2f}x the loop alone ({th['x_alone_min']:.2f}-{th['x_alone_max']:.2f}), "
                f"reader processes {pr['x_alone']:.2f}x ({pr['x_alone_min']:.2f}-{pr['x_alone_max']:.2f}); "
                f"median {a.rounds} interleaved rounds",
                f"forward time lost per read: threads {th['us_lost_per_read']:.0f} µs, processes "
                f"{pr['us_lost_per_read']:.0f} µs (the store's own calls, timed apart: threads {th['store_s']:.3f} s, "
                f"processes {pr['store_s']:.3f} s)",
                f"load average {min(loads):.1f}-{max(loads):.1f}; {time.time() - t_start:.0f} s wall"]
    for h in headline:
        print(h)
    write_bench("reader_interference", title="Background expert reads: loader threads against reader processes",
                headline=headline, tables=[table("reader interference (median of interleaved rounds)", rows)],
                data={"rows": rows, "runs": runs, "args": vars(a)})
    print("wrote out/bench/reader_interference.json")


if __name__ == "__main__":
    main()
