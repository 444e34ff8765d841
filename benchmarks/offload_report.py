"""benchmarks/offload.py's report (a helper module of it, not a script): the headline lines, the runtime's ceilings,
the cost model's error summary, the time split of each configuration, and the printed tables of a run or of a saved
run's JSON (`--report`)."""

from __future__ import annotations

import statistics

from routecast.cache.zoo import uses_forecast


def headline(out: dict) -> list[str]:
    """The claim lines: per budget the best prediction-driven configuration against LRU (median of per-round ratios,
    min-max), its predictor share, logits equality of every run, the load."""
    rows, lines = out["rows"], []
    budgets = sorted({r["config"].rsplit("@", 1)[1] for r in rows if "@" in r["config"]}, key=lambda x: int(x[:-1]))
    for b in budgets:
        here = [r for r in rows if r["config"].endswith(f"@{b}")]
        pred = [r for r in here if r["prefetch"] != "none" or uses_forecast(r["policy"])]  # prefetch or fc-evict
        demand = [r for r in here if r not in pred]
        if pred:
            best = max(pred, key=lambda r: r["x_lru"])
            lines.append(f"budget {b}: best prediction-driven {best['config']} {best['x_lru']:.2f}x LRU tokens/s "
                         f"(per-round min-max {best['x_lru_min']:.2f}-{best['x_lru_max']:.2f}), predictor "
                         f"{best['predictor_share']:.1%} of the run")
        if demand:
            bd = max(demand, key=lambda r: r["x_lru"])
            lines.append(f"budget {b}: best policy without prediction {bd['config']} {bd['x_lru']:.2f}x LRU tokens/s")
        c = ceiling(out.get("runs", {}), b)
        if c is not None:
            need = f"; 1.10x needs {0.10 / (c[0] - 1):.0%} of that margin" if c[0] > 1 else "; 1.10x is out of reach"
            lines.append(f"budget {b}: ceiling {c[0]:.2f}x LRU tokens/s (per-round min-max {c[1]:.2f}-{c[2]:.2f}): the "
                         f"resident-path run, this engine with every expert resident, no reads, stalls or predictor{need}")
        bc = (out.get("belady") or {}).get(b)
        if bc is not None:
            need = (f"1.10x needs {0.10 / (bc['x_lru'] - 1):.0%} of Belady's gain" if bc["x_lru"] > 1.10 else
                    "so 1.10x is beyond any eviction policy at this budget")
            lines.append(f"budget {b}: Belady ceiling {bc['x_lru']:.2f}x LRU tokens/s (per-round min-max "
                         f"{bc['x_lru_min']:.2f}-{bc['x_lru_max']:.2f}): clairvoyant eviction with no prefetch and no "
                         f"predictor time, {bc['load_ratio']:.0%} of LRU's reads at LRU's measured "
                         f"{bc['us_per_read']:.0f} µs per read; {need}")
    bad = [r["config"] for r in rows if not r["logits_allclose"]]
    lines.append("every run's logits allclose to all-resident at every step" if not bad else
                 f"logits NOT allclose to all-resident: {', '.join(bad)}")
    lo, hi = out["load_avg"]
    lines.append(f"load average {lo:.1f}-{hi:.1f} on {out['machine']['cpus']} cores; tier {out['tier']['mode']}")
    return lines


def ceiling(runs: dict[str, list[dict]], b: str) -> tuple[float, float, float] | None:
    """The most any cache or prefetch can gain at budget b in this runtime: per round, LRU's wall time over the
    resident-path run's (the same engine, every expert preloaded: no read, stall or predictor time) -> (median, min,
    max), or None when the run has no resident-path or LRU rounds."""
    res, lru = runs.get("resident-path"), runs.get(f"lru@{b}")
    if not res or not lru or len(res) != len(lru):
        return None
    x = [lr["wall_s"] / rp["wall_s"] for lr, rp in zip(lru, res, strict=True)]
    return statistics.median(x), min(x), max(x)


def cost_model_error(rows: list[dict]) -> dict | None:
    """|model err| over exactly the offloaded configurations not used in the fit (FITTED excluded): n, names, median."""
    priced = [r for r in rows if r["config"] not in FITTED and r.get("model_error") is not None]
    if not priced:
        return None
    errs = [abs(r["model_error"]) for r in priced]
    kerrs = [abs(r["kernel_error"]) for r in priced if r.get("kernel_error") is not None]
    return {"n": len(priced), "rows": [r["config"] for r in priced], "median": statistics.median(errs),
            "max": max(errs), "kernel_median": statistics.median(kerrs) if kerrs else float("nan")}


def _f(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


FITTED = ("all-resident", "resident-path", "on-demand")  # the rounds 1..F of these fit dense_us, engine_us, read_us


def time_split(runs: dict[str, list[dict]], configs) -> list[dict]:
    """Per configuration, medians over rounds of the engine's time split (engine.figures): wall, expert accesses and
    their stall in prefill and decode steps, predictor, and the rest of the forward."""
    out = []
    for label, budget, *_ in configs:
        rs = runs[label]
        if budget is None:  # all-resident runs transformers' own forward: no split
            continue

        def med(f, rs=rs) -> float:
            return statistics.median(f(r) for r in rs)

        out.append({"config": label, "wall_s": med(lambda r: r["wall_s"]),
                    "experts_prefill_s": med(lambda r: r["experts_prefill_s"]),
                    "stall_prefill_s": med(lambda r: r["stall_prefill_s"]),
                    "experts_decode_s": med(lambda r: r["experts_decode_s"]),
                    "stall_decode_s": med(lambda r: r["stall_decode_s"]),
                    "predict_s": med(lambda r: r.get("predict_s", 0.0)),
                    "outside_s": med(lambda r: r["wall_s"] - r["experts_prefill_s"] - r["experts_decode_s"]
                                     - r.get("predict_s", 0.0)),
                    "reads": med(lambda r: r["reads"])})
    return out


def print_report(out: dict) -> None:
    """The result table and the last round's counters of a run (also `--report JSON` for a saved run)."""
    rows, tier, st = out["rows"], out["tier"], out["settings"]
    by = {r["config"]: r for r in rows}
    od = by["on-demand"]["tokens_per_s"]
    ar = by["all-resident"]["tokens_per_s"]
    lo, hi = out["load_avg"]
    m = out["cost_terms"]
    print(f"\n{st['model']}, {st['prompts']} x {st['max_new_tokens']} new tokens, one request at a time; median of "
          f"{st['repeats']} interleaved rounds (min-max); load average {lo:.1f}-{hi:.1f} on {out['machine']['cpus']} cores; "
          f"tier {tier['mode']} {tier['bandwidth_Bps'] / 1e9:.3f} GB/s")
    print(f"cost model terms (fitted on rounds 1..{m['fit_rounds']}): dense {m['dense_us']:.0f} µs per layer, engine {m['engine_us']:+.0f} µs "
          f"per layer, {m['read_us']:.0f} µs of compute thread per read, each configuration's predictor seconds; "
          f"errors against the median of rounds {m['fit_rounds'] + 1}..{st['repeats']}")
    head = ("config", "tok/s", "(min-max)", "x LRU (min-max)", "x on-demand", "x all-resident", "hit", "late",
            "replay hit (run 1)", "replay late", "kernel on-time", "MB read", "stall", "predictor share", "model tok/s",
            "model err", "kernel err", "logits allclose")
    print(" | ".join(head))
    for r in rows:
        print(" | ".join([
            r["config"], f"{r['tokens_per_s']:.2f}", f"({r['tokens_per_s_min']:.1f}-{r['tokens_per_s_max']:.1f})",
            "-" if r["x_lru"] is None else f"{r['x_lru']:.2f} ({r['x_lru_min']:.2f}-{r['x_lru_max']:.2f})",
            f"{r['tokens_per_s'] / od:.2f}", f"{r['tokens_per_s'] / ar:.2f}", f"{r['hit_ratio']:.3f}", f"{r.get('late', 0):.0f}",
            "-" if r["replay_hit_ratio"] is None else f"{r['replay_hit_ratio']:.3f} ({r['runtime_hit_ratio_run0']:.3f})",
            f"{r.get('replay_late', 0)}", "-" if r.get("kernel_hit_ratio") is None else f"{r['kernel_hit_ratio']:.3f}",
            f"{r['bytes_read'] / 1e6:.1f}", f"{r['stall_share']:.1%}", f"{r['predictor_share']:.1%}",
            _f(r["model_tokens_per_s"], ".2f"), _f(r["model_error"], "+.1%"), _f(r["kernel_error"], "+.1%"),
            str(r["logits_allclose"])]))
    err = cost_model_error(rows)
    if err:
        print(f"cost model over the {err['n']} offloaded configurations not used in the fit ({', '.join(err['rows'])}): "
              f"median |model err| {err['median']:.1%} (max {err['max']:.1%}); kernel alone {err['kernel_median']:.1%}")
    for line in out.get("headline", []):
        print(line)
    split = out["tables"][1]["rows"] if len(out.get("tables", [])) > 1 else []
    if split:
        print("\nwhere the time goes (s per run, median of rounds): wall | expert accesses in prefill steps (of which "
              "stall) | in decode steps (of which stall) | predictor | the rest of the forward | reads")
        for r in split:
            print(f"{r['config']} | {r['wall_s']:.3f} | {r['experts_prefill_s']:.3f} ({r['stall_prefill_s']:.3f}) | "
                  f"{r['experts_decode_s']:.3f} ({r['stall_decode_s']:.3f}) | {r['predict_s']:.3f} | "
                  f"{r['outside_s']:.3f} | {r['reads']:.0f}")
    print("\nlast round's counters: wall s | predictor s | stall s | reads | s inside reads (summed over threads) | "
          "prefetches issued / loaded / useful / cancelled / dropped")
    for k, v in out["runs"].items():
        r = v[-1]
        print(f"{k} | {r['wall_s']:.1f} | {r.get('predict_s', 0):.2f} | {r.get('stall_s', 0):.2f} | {r.get('reads', 0)} | "
              f"{r.get('read_s', 0):.2f} | {r.get('prefetch_issued', 0)} / {r.get('prefetch_loaded', 0)} / "
              f"{r.get('prefetch_useful', 0)} / {r.get('prefetch_cancelled', 0)} / {r.get('prefetch_dropped', 0)}")
