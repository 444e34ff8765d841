"""Cost of recording routing during generate: the same greedy generate with RoutingRecorder hooks on vs off.

Same inputs every run (fixed-seed random prompts of 16-64 tokens, left padded, batch_size rows per batch,
exactly max_new_tokens new tokens: eos is disabled so every run does the same work). Modes, interleaved
within each repetition (order rotated every repetition so drift hits all modes alike):
- off: no hooks;
- ids: hooks recording the executed expert ids and weights (what `routecast capture` records by default);
- ids+logits+hidden: also the router logits and router input hidden states (--logits --hidden).
For each hooked mode the time of the bookkeeping after generate (RoutingRecorder.forwards(): stacking,
conversion to numpy) is measured separately. Reported: median seconds per pass over all batches, and the
overhead in % of the hook-free forward+generate time, for hooks alone and hooks + bookkeeping. Times
are CPU seconds of the running thread (robust on a shared machine); wall-clock overhead is reported too.
Target: hooks <= 10% of forward time.

The overhead is quoted as the median of per-repetition paired ratios with its quartiles and a
distribution-free 95% confidence interval of the median; on a shared machine a few % of overhead needs
tens of repetitions to resolve.

Usage: python benchmarks/capture_overhead.py [--model tiny|builtin] [--reps 31] [--batch-size 8]
       [--batches 2] [--max-new-tokens 32] [--threads 1]
--model tiny (default): a random Mixtral config (4 layers, hidden 64, 8 experts, top-2, vocab 512).
--model builtin: the checkpoint in routecast/models/builtin/ (routecast.models.builtin.builtin_path()).
Writes out/bench/capture_overhead.json; prints a table and the machine it ran on.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from routecast.common.bench import table, write_bench
from routecast.trace.capture import RoutingRecorder

MODES = ("off", "ids", "ids+logits+hidden")


def tiny_mixtral(seed: int = 0) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("mixtral", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                               num_attention_heads=4, num_key_value_heads=2, num_local_experts=8,
                               num_experts_per_tok=2, max_position_embeddings=256, pad_token_id=0, eos_token_id=1,
                               bos_token_id=None)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg).eval()


def builtin_model(name: str = "builtin") -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    try:
        from routecast.models.builtin import builtin_path
    except ImportError as e:
        raise SystemExit(f"--model {name}: routecast.models.builtin is not importable ({e}); use --model tiny.") from None
    path = Path(builtin_path(name))
    if not (path / "config.json").is_file():
        raise SystemExit(f"--model {name}: {path} holds no checkpoint (config.json); use --model tiny.")
    return AutoModelForCausalLM.from_pretrained(path).eval()


def make_batches(vocab: int, n_batches: int, batch_size: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Left-padded (input_ids [B,S], attention_mask [B,S]) batches of random prompts, 16-64 tokens each."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_batches):
        lens = rng.integers(16, 65, batch_size)
        S = int(lens.max())
        ids = np.zeros((batch_size, S), np.int64)
        mask = np.zeros((batch_size, S), np.int64)
        for b, n in enumerate(lens):  # per prompt, not per token
            ids[b, S - n:] = rng.integers(2, vocab, n)
            mask[b, S - n:] = 1
        out.append((torch.from_numpy(ids), torch.from_numpy(mask)))
    return out


def one_pass(model, batches, mode: str, max_new: int) -> tuple[float, float, float, int]:
    """(generate CPU s, bookkeeping CPU s, generate wall s, tokens processed) for one pass over all batches.

    CPU time of this thread: with one torch thread every op runs here, and unlike wall time it does not
    count the time other processes hold the core (the machine is shared).
    """
    gen_s = book_s = wall_s = 0.0
    tokens = 0
    kw = dict(max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False, num_beams=1, use_cache=True,
              pad_token_id=0, eos_token_id=None)
    rec = None if mode == "off" else RoutingRecorder(model, logits=mode != "ids", hidden=mode != "ids")
    for ids, mask in batches:
        if rec is not None:
            rec.reset()
            rec.install()
        t0, w0 = time.thread_time(), time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, **kw)
        gen_s += time.thread_time() - t0
        wall_s += time.perf_counter() - w0
        if rec is not None:
            rec.remove()
            t0 = time.thread_time()
            fw = rec.forwards()
            book_s += time.thread_time() - t0
            assert len(fw) == max_new
            rec.reset()
        tokens += int(mask.sum()) + ids.shape[0] * (out.shape[1] - ids.shape[1] - 1)
    return gen_s, book_s, wall_s, tokens


class _Sink(torch.nn.Module):
    """Stands in for experts(): the same call signature and no work, so only the hook's cost remains."""

    def forward(self, hidden: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return hidden


def hook_call_cost(model: torch.nn.Module, per_batch: int, calls: int = 20000) -> dict:
    """Extra CPU microseconds per experts() call once the ids hook is installed (decode-sized inputs).

    Timed on a no-op module with experts()'s signature, hooked by RoutingRecorder's own hook vs not,
    alternating in 9 paired blocks (median difference / calls): the whole cost of recording, module
    hook dispatch included, without the noise of the experts' compute. Records are dropped every
    per_batch calls, as capture does after each batch.
    """
    rec = RoutingRecorder(model)
    b = rec.blocks[0]
    sink = _Sink()
    h = torch.randn(1, rec.spec.hidden_size)
    with torch.no_grad():
        _, w, ids = b.router(h)
    hook = rec._experts_hook(0)
    diffs = []
    for _ in range(9):
        t = []
        for hooked in (False, True):
            handle = sink.register_forward_pre_hook(hook, with_kwargs=True) if hooked else None
            t0 = time.thread_time()
            with torch.no_grad():
                for i in range(calls):
                    sink(h, ids, w)
                    if i % per_batch == 0:
                        rec.reset()
            t.append(time.thread_time() - t0)
            if handle is not None:
                handle.remove()
        diffs.append((t[1] - t[0]) / calls)
    return {"overhead_us": 1e6 * statistics.median(diffs), "hooks_per_forward": len(rec.blocks)}


def spread(ratios: list[float]) -> dict:
    """Median, quartiles and a distribution-free ~95% confidence interval of the median, all in %.

    The interval is the order-statistic one (ranks n/2 -+ 0.98 sqrt(n)), so it needs no normality; with the
    per-repetition paired ratios it says whether the overhead is resolved (interval excludes 0) on this machine.
    """
    x = np.sort(100 * np.asarray(ratios, np.float64))
    n = len(x)
    lo = max(int(np.floor(n / 2 - 0.98 * np.sqrt(n))), 0)
    hi = min(int(np.ceil(n / 2 + 0.98 * np.sqrt(n))), n - 1)
    return {"median": float(np.median(x)), "p25": float(np.percentile(x, 25)), "p75": float(np.percentile(x, 75)),
            "ci95": [float(x[lo]), float(x[hi])], "n": n}


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("tiny", "builtin", "builtin-fine"), default="tiny",
                    help="tiny random Mixtral or a built-in checkpoint (builtin: Mixtral; builtin-fine: DeepSeek-V3)")
    ap.add_argument("--reps", type=int, default=31, help="interleaved repetitions per mode (median reported)")
    ap.add_argument("--batch-size", type=int, default=8, help="prompts per generate call")
    ap.add_argument("--batches", type=int, default=2, help="generate calls per pass")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="new tokens per prompt (eos disabled)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--seed", type=int, default=0, help="prompt and model seed")
    ap.add_argument("--out", default="out/bench/capture_overhead.json", help="JSON result path")
    ap.add_argument("--quick", action="store_true", help="7 repetitions instead of --reps")
    a = ap.parse_args(argv)
    if a.quick:
        a.reps = min(a.reps, 7)
    torch.set_num_threads(a.threads)
    model = tiny_mixtral(a.seed) if a.model == "tiny" else builtin_model(a.model)
    batches = make_batches(model.config.vocab_size, a.batches, a.batch_size, a.seed)
    one_pass(model, batches[:1], "ids+logits+hidden", 2)  # warm-up: allocator, lazy init
    times: dict[str, list[tuple[float, float, float]]] = {m: [] for m in MODES}
    tokens = 0
    for r in range(a.reps):
        for m in MODES[r % len(MODES):] + MODES[: r % len(MODES)]:
            g, b, w, tokens = one_pass(model, batches, m, a.max_new_tokens)
            times[m].append((g, b, w))
    # Overhead from paired runs (same repetition, adjacent in time): the median of per-repetition ratios
    # cancels the slow drift of a shared machine better than a ratio of medians.
    off = [t[0] for t in times["off"]]
    rows = []
    for m in MODES:
        g = [t[0] for t in times[m]]
        gb = [t[0] + t[1] for t in times[m]]
        w = [t[2] / o[2] - 1 for t, o in zip(times[m], times["off"], strict=True)]
        hooks = spread([x / o - 1 for x, o in zip(g, off, strict=True)])
        total = spread([x / o - 1 for x, o in zip(gb, off, strict=True)])
        rows.append({"mode": m, "generate_cpu_s": statistics.median(g), "hooks_spread_pct": hooks,
                     "total_spread_pct": total,
                     "bookkeeping_cpu_s": statistics.median(t[1] for t in times[m]),
                     "hooks_overhead_pct": 100 * statistics.median(x / o - 1 for x, o in zip(g, off, strict=True)),
                     "total_overhead_pct": 100 * statistics.median(x / o - 1 for x, o in zip(gb, off, strict=True)),
                     "wall_overhead_pct": 100 * statistics.median(w), "tokens": tokens,
                     "tokens_per_cpu_s": tokens / statistics.median(gb), "all_runs_cpu_s": g})
    per_call = hook_call_cost(model, a.max_new_tokens)
    fwd_s = statistics.median(off) / (a.batches * a.max_new_tokens)
    spec = RoutingRecorder(model).spec
    result = {"benchmark": "capture_overhead", "model": a.model, "spec": spec.to_dict(), "reps": a.reps,
              "batch_size": a.batch_size, "batches": a.batches, "max_new_tokens": a.max_new_tokens,
              "machine": machine(), "results": rows, "hook_call": per_call, "forward_cpu_s": fwd_s,
              "hooks_estimate_pct": 100 * per_call["overhead_us"] * 1e-6 * per_call["hooks_per_forward"] / fwd_s}
    head = []
    for r in rows[1:]:
        for what in ("hooks", "total"):
            sp = r[f"{what}_spread_pct"]
            resolved = "resolved" if sp["ci95"][0] > 0 or sp["ci95"][1] < 0 else "not resolved from 0"
            head.append(f"{r['mode']} {what}: {sp['median']:+.1f}% of hook-free generate [95% CI of the median "
                        f"{sp['ci95'][0]:+.1f}, {sp['ci95'][1]:+.1f}], n={sp['n']}: {resolved}")
    head.append(f"per hooked call: +{per_call['overhead_us']:.1f} us ({per_call['hooks_per_forward']} hooked calls per "
                f"forward of {fwd_s * 1e3:.2f} ms) -> estimated hooks overhead {result['hooks_estimate_pct']:.2f}%")
    cols = ("mode", "generate_cpu_s", "bookkeeping_cpu_s", "hooks_overhead_pct", "total_overhead_pct",
            "wall_overhead_pct", "tokens_per_cpu_s")
    out = write_bench("capture_overhead", title=f"Capture overhead: routing hooks on generate ({a.model} model)",
                      headline=head, tables=[table(f"medians of {a.reps} interleaved repetitions (thread CPU time)",
                                                   [{c: r[c] for c in cols} for r in rows])],
                      data=result, quick=a.quick, path=a.out)
    mc = result["machine"]
    print(f"machine: {mc['cpu']}, {mc['cores']} cores, torch {mc['torch']} with {mc['torch_threads']} thread(s)")
    print(f"model: {a.model} ({spec.num_layers} MoE layers, {spec.num_experts} experts, top-{spec.top_k}); "
          f"{a.batches} x {a.batch_size} prompts, {a.max_new_tokens} new tokens, median of {a.reps}")
    print("times are medians of this thread's CPU time; overhead in % of the hook-free generate")
    print(f"{'mode':<20}{'generate s':>11}{'bookkeep s':>11}{'hooks %':>9}{'+book %':>9}{'wall %':>8}{'tok/cpu-s':>11}")
    for r in rows:
        print(f"{r['mode']:<20}{r['generate_cpu_s']:>11.3f}{r['bookkeeping_cpu_s']:>11.4f}"
              f"{r['hooks_overhead_pct']:>9.1f}{r['total_overhead_pct']:>9.1f}{r['wall_overhead_pct']:>8.1f}"
              f"{r['tokens_per_cpu_s']:>11.0f}")
    print("paired per-repetition overhead, % of hook-free generate: median [95% CI of the median] (quartiles)")
    for r in rows[1:]:
        for what in ("hooks", "total"):
            sp = r[f"{what}_spread_pct"]
            resolved = "resolved" if sp["ci95"][0] > 0 or sp["ci95"][1] < 0 else "not resolved from 0"
            print(f"  {r['mode']:<18} {what:<6} {sp['median']:+.1f}% [{sp['ci95'][0]:+.1f}, {sp['ci95'][1]:+.1f}] "
                  f"({sp['p25']:+.1f} .. {sp['p75']:+.1f}), n={sp['n']}: {resolved}")
    print(head[-1])
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
