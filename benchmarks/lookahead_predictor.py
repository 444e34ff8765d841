"""PROBE's lookahead predictor per layer: frozen-gate prior vs offline-distilled vs online, with its cost.

The trace (with router inputs and logits: ``routecast capture --hidden --logits``) is split by source
document (--split document, the default: no held-out request shares a document with a training one; a trace
that records no documents falls back to requests with a note) or by request (--split request), with
--train-fraction, seeded. Variants, each scored causally on the held-out requests (layer horizon):
- untrained: the cloned routers of layer l applied to layer l-1's router input (eq. 7, zero residual);
- offline: the residual MLP distilled on the training requests (--epochs passes, Adam);
- online: starts as the untrained prior and distils while it streams over the held-out steps (replay
  buffer of --buffer-tokens tokens, --online-updates Adam steps after each observed step);
- offline+online: the offline predictor, then distilled online on the held-out stream.
Layer 0 has no lookahead input; every variant forecasts it with the training requests' slot shares.

Per layer: top-k accuracy, top-half-k hit rate and recall@2k (PROBE §6.4), the online variant's
top-k accuracy (layers >= 1) per window of --window steps, and the cost: the predictor's forward
(prior + residual + routing rule) and the model's MoE block (routecast.trace.capture_arch.find_blocks,
the built-in model's ``model.layers[l].mlp``) timed in this run on the same step batches of held-out
tokens, one thread, best of --repeat.

Usage: python benchmarks/lookahead_predictor.py [--trace DIR] [--quick] [--model builtin|builtin-fine|DIR] [--split document|request] [--epochs 8]
       [--window 25] [--repeat 3] [--out out/bench/lookahead_predictor.json]
Prints a table and writes the JSON; the machine is stated in both.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from routecast.common.bench import table, write_bench  # noqa: E402
from routecast.common.machine import machine_info  # noqa: E402
from routecast.predict.harness import run_harness  # noqa: E402
from routecast.predict.lookahead import LookaheadConfig, LookaheadPredictor  # noqa: E402
from routecast.predict.metrics import topk_accuracy  # noqa: E402
from routecast.trace import Trace  # noqa: E402
from routecast.trace.capture import load_model  # noqa: E402
from routecast.trace.capture_arch import find_blocks  # noqa: E402
from routecast.trace.io import read_trace  # noqa: E402

METRICS = ("top_k_accuracy", "top_half_k_hit_rate", "recall_at_2k")
PAPER = {"untrained top-k acc": "~70-80%", "distilled top-k acc": "87-94%", "half-k hit / recall@2k": "near 100%"}


def windowed_accuracy(forecasts: list, test: Trace, window: int) -> list[dict]:
    """Top-k accuracy of layers >= 1 per window of `window` steps, token-weighted: [{steps, tokens, acc}]."""
    out, acc_sum, n_tok, first = [], 0.0, 0, None
    batches = list(test.batches())
    for i, ((step, fc), (step2, idx)) in enumerate(zip(forecasts, batches, strict=True)):
        assert step == step2
        first = step if first is None else first
        acc = topk_accuracy(fc.token_topk(len(idx)), test.experts_TLK[idx].astype(np.int64))[:, 1:]
        acc_sum += float(np.nansum(acc)) / acc.shape[1]
        n_tok += len(idx)
        if (i + 1) % window == 0 or i == len(forecasts) - 1:
            out.append({"steps": [int(first), int(step)], "tokens": n_tok, "acc": acc_sum / max(n_tok, 1)})
            acc_sum, n_tok, first = 0.0, 0, None
    return out


@torch.no_grad()
def time_costs(pred: LookaheadPredictor, blocks: list, test: Trace, repeat: int) -> list[dict]:
    """Per layer >= 1: predictor forward vs MoE block forward on the held-out step batches (µs/token, best of repeat)."""
    hidden = torch.from_numpy(np.array(test.hidden_TLH, np.float32))
    batches = [torch.from_numpy(idx) for _, idx in test.batches()]
    rows = []
    for layer in range(1, test.spec.num_layers):
        corr = pred.net.correction[layer - 1]
        best_p = best_m = float("inf")
        for _ in range(repeat):
            ns_p = ns_m = 0
            for idx in batches:
                h_prev, h_now = hidden[idx, layer - 1], hidden[idx, layer]
                t0 = time.perf_counter_ns()
                pred.rule.forecast(pred.net.one(layer - 1, h_prev), corr)
                t1 = time.perf_counter_ns()
                blocks[layer].block(h_now[None])
                ns_m += time.perf_counter_ns() - t1
                ns_p += t1 - t0
            best_p, best_m = min(best_p, ns_p), min(best_m, ns_m)
        n = test.num_tokens
        rows.append({"layer": layer, "predictor_us_per_token": best_p / n / 1e3, "moe_us_per_token": best_m / n / 1e3,
                     "ratio": best_p / best_m})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default=None, help="trace directory captured with --hidden --logits (default: the "
                                                  "standard trace 'builtin')")
    ap.add_argument("--quick", action="store_true", help="2 distillation epochs, 1 timing repeat")
    ap.add_argument("--model", default="builtin", help="model the trace was captured from: builtin, builtin-fine or a directory")
    ap.add_argument("--split", choices=("document", "request"), default="document",
                    help="held-out split (default document: no source document on both sides)")
    ap.add_argument("--train-fraction", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=8, help="offline distillation epochs")
    ap.add_argument("--mlp-dim", type=int, default=64)
    ap.add_argument("--buffer-tokens", type=int, default=4096)
    ap.add_argument("--online-updates", type=int, default=1)
    ap.add_argument("--window", type=int, default=25, help="steps per window of the online accuracy curve")
    ap.add_argument("--repeat", type=int, default=3, help="cost timing repeats (best taken)")
    ap.add_argument("--out", default="out/bench/lookahead_predictor.json", help="JSON output")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.trace is None:
        from routecast.trace.standard import standard_trace

        a.trace = standard_trace("builtin")
    if a.quick:
        a.epochs, a.repeat = min(a.epochs, 2), 1

    trace = read_trace(a.trace)
    (train, test), split, note = trace.heldout_split(a.split, (a.train_fraction, 1 - a.train_fraction), seed=a.seed)
    if note:
        print(note)
    model = load_model(a.model)[0]
    blocks = find_blocks(model)
    base = LookaheadConfig(mlp_dim=a.mlp_dim, buffer_tokens=a.buffer_tokens, online_updates=a.online_updates,
                           seed=a.seed, epochs=0)
    variants = {
        "untrained": base,
        "offline": dataclasses.replace(base, epochs=a.epochs),
        "online": dataclasses.replace(base, online=True),
        "offline+online": dataclasses.replace(base, epochs=a.epochs, online=True),
    }
    results, preds = {}, {}
    for name, cfg in variants.items():
        t0 = time.perf_counter()
        pred = LookaheadPredictor.from_model(model, trace.spec, config=cfg).fit(train)
        fit_s = time.perf_counter() - t0
        res = run_harness(pred, test, collect=True)
        results[name] = {
            "per_layer": {m: res.metrics[m] for m in METRICS},
            "mean_layers_ge_1": {m: float(np.mean(res.metrics[m][1:])) for m in METRICS},
            "fit_s": fit_s, "fit_loss": pred.fit_log, "harness_us_per_token_all_layers": res.us_per_token,
            "observe_us_per_batch": res.observe_us_per_batch,
            "windows": windowed_accuracy(res.forecasts, test, a.window),
        }
        preds[name] = pred
    cost = time_costs(preds["offline"], blocks, test, a.repeat)

    L = trace.spec.num_layers
    mach = machine_info()
    print(f"trace {a.trace}: {trace.num_tokens} tokens, L={L}, E={trace.spec.num_experts}, K={trace.spec.top_k}; "
          f"held-out {test.num_tokens} tokens / {len(np.unique(test.step))} steps "
          f"(split by {split}: {1 - a.train_fraction:.0%} of the {split}s, seed {a.seed}); model {a.model}")
    print(f"machine: {mach['cpu']}, {mach['cpus']} CPUs, torch {torch.__version__}, 1 thread\n")
    head = f"{'variant':15} {'layer':>5} {'top-k acc':>9} {'half-k hit':>10} {'recall@2k':>9}"
    print(head + "\n" + "-" * len(head))
    for name, r in results.items():
        for layer in range(L):
            v = [r["per_layer"][m][layer] for m in METRICS]
            tag = " (fallback: train slot shares)" if layer == 0 else ""
            print(f"{name:15} {layer:>5} {v[0]:>9.3f} {v[1]:>10.3f} {v[2]:>9.3f}{tag}")
        mm = r["mean_layers_ge_1"]
        print(f"{name:15} {'1..':>5} {mm['top_k_accuracy']:>9.3f} {mm['top_half_k_hit_rate']:>10.3f} "
              f"{mm['recall_at_2k']:>9.3f}  (mean of layers >= 1)")
    print("\nonline top-k accuracy (layers >= 1) per window of", a.window, "steps:")
    for name in ("online", "offline+online"):
        print(f"  {name:15}", " ".join(f"{w['acc']:.3f}" for w in results[name]["windows"]))
    print("\ncost per token (offline predictor, one layer; MoE block timed on the same held-out step batches):")
    for c in cost:
        print(f"  layer {c['layer']}: predictor {c['predictor_us_per_token']:.3f} µs, MoE block "
              f"{c['moe_us_per_token']:.3f} µs, ratio {c['ratio']:.3f}")
    print(f"\npaper (PROBE §6.4): {PAPER}")

    doc = {"trace": str(a.trace), "model": a.model, "trace_tokens": trace.num_tokens, "test_tokens": test.num_tokens,
           "test_steps": int(len(np.unique(test.step))), "train_fraction": a.train_fraction, "seed": a.seed,
           "split": split,
           "args": {k: str(v) for k, v in vars(a).items()}, "machine": {**mach, "torch_threads": 1}, "variants": results, "cost": cost,
           "paper": PAPER}
    head = [f"{name}: top-k accuracy {r['mean_layers_ge_1']['top_k_accuracy']:.3f}, recall@2k "
            f"{r['mean_layers_ge_1']['recall_at_2k']:.3f} (mean of layers >= 1, held-out {split}s)"
            for name, r in results.items()]
    head += [f"layer {c['layer']}: predictor {c['predictor_us_per_token']:.3f} µs/token = {c['ratio']:.3f} x the MoE "
             f"block's {c['moe_us_per_token']:.3f}" for c in cost]
    rows = [{"variant": name, "layer": layer, **{m: r["per_layer"][m][layer] for m in METRICS}}
            for name, r in results.items() for layer in range(L)]
    out = write_bench("lookahead_predictor", title="PROBE's gate-initialised lookahead predictor: accuracy and cost",
                      headline=head, tables=[table("per variant and layer, held-out steps", rows,
                                                   note="layer 0 falls back to the training slot shares"),
                                             table("cost per token, one layer", cost)],
                      data=doc, quick=a.quick, path=a.out)
    print("\n".join(head))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
