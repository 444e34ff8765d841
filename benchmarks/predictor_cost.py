"""Prediction cost of every MoE-GPS predictor, next to the MoE model's own forward time, in one run.

For each predictor: fit on 80% of the trace's requests, then walk the held-out 20% step by step with
the causal harness (routecast.predict.harness) and time every predict() call: µs per token and µs per
batch (= step), plus the observe() update and top-k accuracy for context. In the same process, when a
checkpoint is available (--model, default the built-in model when it is trained), the model's forward
pass is timed on CPU at two shapes: prefill (1 sequence of --prefill-len tokens) and decode (--decode-batch
sequences, one new token each, on a KV cache of --prefill-len tokens). The ratio column is the
predictor's µs/token over the model's decode µs/token (MoE-GPS: a predictor is only worth its accuracy
if its overhead is small against the forward it serves).

Trace: --trace DIR, or a synthetic trace at the built-in model's geometry (4 layers, 8 experts, top-2,
vocabulary 4096) with token-expert affinity and continuous batching (16 running requests, prompts of
64 tokens, 32 generated tokens).

Usage: python benchmarks/predictor_cost.py [--trace DIR] [--model builtin|DIR|none] [--tokens 16384]
       [--predictors distribution,...] [--epochs N] [--repeat 20] [--threads 1]
Writes out/bench/predictor_cost.json and prints a table; the machine is stated in both.
"""

from __future__ import annotations

import os

# One thread everywhere, set before numpy/torch are imported (they read these once, at import).
for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from routecast.common.bench import table, write_bench  # noqa: E402
from routecast.common.errors import ConfigError  # noqa: E402
from routecast.common.timing import median_seconds  # noqa: E402
from routecast.predict.embeddings import load_input_embeddings, resolve_model_dir  # noqa: E402
from routecast.predict.evaluate import PREDICTOR_NAMES, make_predictor  # noqa: E402
from routecast.predict.harness import run_harness  # noqa: E402
from routecast.trace import Trace  # noqa: E402


def synthetic_trace(tokens: int, seed: int) -> Trace:
    """Built-in geometry with token and request affinity, served with continuous batching."""
    from routecast.trace.synth import SynthConfig, generate

    cfg = SynthConfig(name="builtin-geometry-synthetic", num_layers=4, num_experts=8, top_k=2, vocab_size=4096,
                      num_tokens=tokens, seed=seed, token_strength=3.0, request_strength=1.0,
                      prompt_len=(64.0,), output_len=(32.0,), max_running=16, token_budget=512)
    return generate(cfg)


def machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version()}


def model_forward(model_dir: Path, *, prefill_len: int, decode_batch: int, repeat: int, seed: int) -> dict:
    """Median CPU forward time of the checkpoint: prefill (1 x prefill_len) and one decode step."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        ids = torch.randint(0, vocab, (1, prefill_len), generator=g)
        t_prefill = median_seconds(lambda: model(input_ids=ids, use_cache=False), repeat)
        ctx = torch.randint(0, vocab, (decode_batch, prefill_len), generator=g)
        past = model(input_ids=ctx, use_cache=True).past_key_values
        nxt = torch.randint(0, vocab, (decode_batch, 1), generator=g)
        # Each timed call appends one position to the cache: the context grows by `repeat` (< 10%).
        t_decode = median_seconds(lambda: model(input_ids=nxt, past_key_values=past, use_cache=True), repeat)
    return {"model_dir": str(model_dir), "prefill_len": prefill_len, "decode_batch": decode_batch,
            "prefill_us_per_token": t_prefill * 1e6 / prefill_len, "prefill_us_per_batch": t_prefill * 1e6,
            "decode_us_per_token": t_decode * 1e6 / decode_batch, "decode_us_per_batch": t_decode * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", help="trace directory (default: a synthetic trace at the built-in geometry)")
    ap.add_argument("--model", default=None, help="checkpoint for embeddings and forward timing: builtin, DIR or "
                    "none (default: the built-in model when trained, else none)")
    ap.add_argument("--predictors", default=",".join(PREDICTOR_NAMES), help="comma-separated predictor names")
    ap.add_argument("--tokens", type=int, default=16384, help="tokens of the synthetic trace (default 16384)")
    ap.add_argument("--epochs", type=int, default=None, help="neural training epochs (default: preset, early stop)")
    ap.add_argument("--prefill-len", type=int, default=64, help="model timing: prefill length (default 64)")
    ap.add_argument("--decode-batch", type=int, default=16, help="model timing: decode batch (default 16)")
    ap.add_argument("--repeat", type=int, default=20, help="model timing: timed forwards, median (default 20)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--seed", type=int, default=0, help="split, synthetic trace and training seed (default 0)")
    ap.add_argument("--out", default="out/bench/predictor_cost.json", help="JSON output path")
    ap.add_argument("--quick", action="store_true", help="4096 tokens, 2 training epochs, 5 timed forwards")
    a = ap.parse_args()
    if a.quick:
        a.tokens, a.repeat = min(a.tokens, 4096), min(a.repeat, 5)
        a.epochs = 2 if a.epochs is None else a.epochs
    torch.set_num_threads(a.threads)

    if a.trace:
        from routecast.trace.io import read_trace

        trace, trace_desc = read_trace(a.trace, load_hidden=False, load_logits=False), a.trace
    else:
        trace, trace_desc = synthetic_trace(a.tokens, a.seed), f"synthetic ({a.tokens} tokens, built-in geometry)"
    if a.model is None:
        try:
            model_dir = resolve_model_dir("builtin")
        except ConfigError as e:
            print(f"note: {e} Timing predictors only.")
            model_dir = None
    else:
        model_dir = resolve_model_dir(a.model, trace.provenance)
    emb = load_input_embeddings(model_dir) if model_dir is not None else None
    if emb is not None and int(trace.token_id.max()) >= emb.shape[0]:
        print(f"note: trace token ids exceed the {emb.shape[0]}-row embedding table; neural predictors learn their own.")
        emb = None
    (train, test), split, note = trace.heldout_split("document", (0.8, 0.2), seed=a.seed)
    if note:
        print(note)
    steps = len(np.unique(test.step))
    print(f"trace: {trace_desc}; {trace!r}; test (split by {split}): {test.num_tokens} tokens in {steps} steps "
          f"({test.num_tokens / max(steps, 1):.1f} tokens/step)")

    model = None
    if model_dir is not None:
        model = model_forward(model_dir, prefill_len=a.prefill_len, decode_batch=a.decode_batch, repeat=a.repeat,
                              seed=a.seed)
        print(f"model forward ({model_dir}): prefill {model['prefill_us_per_token']:.1f} µs/token, "
              f"decode batch {a.decode_batch}: {model['decode_us_per_batch']:.0f} µs/step = "
              f"{model['decode_us_per_token']:.1f} µs/token")

    rows = []
    names = [n.strip() for n in a.predictors.split(",") if n.strip()]
    if "lookahead" in names and (trace.hidden_TLH is None or model_dir is None):
        names.remove("lookahead")  # it reads the router inputs of a captured trace and the model's routers
        print("note: lookahead left out: it needs a trace captured with --hidden --logits and its model.")
    for name in names:
        pred = make_predictor(name, trace.spec, embeddings=emb, embedding_source=str(model_dir or ""), seed=a.seed,
                              threads=a.threads, progress=False, epochs=a.epochs, model_path=model_dir)
        t0 = time.perf_counter()
        pred.fit(train)
        fit_s = time.perf_counter() - t0
        res = run_harness(pred, test)
        row = {"predictor": name, "fit_s": fit_s, "us_per_token": res.us_per_token, "us_per_batch": res.us_per_batch,
               "observe_us_per_batch": res.observe_us_per_batch,
               "top_k_accuracy": float(np.nanmean(res.metrics["top_k_accuracy"])),
               "embedding": getattr(pred, "embedding_source", "")}
        if model is not None:
            row["ratio_to_decode_token"] = res.us_per_token / model["decode_us_per_token"]
        rows.append(row)

    head = f"{'predictor':<22}{'fit s':>8}{'µs/token':>10}{'µs/batch':>10}{'observe µs':>12}{'top-k acc':>11}"
    head += f"{'x decode':>10}" if model else ""
    print(head)
    for r in rows:
        line = (f"{r['predictor']:<22}{r['fit_s']:>8.2f}{r['us_per_token']:>10.2f}{r['us_per_batch']:>10.1f}"
                f"{r['observe_us_per_batch']:>12.1f}{r['top_k_accuracy']:>11.3f}")
        print(line + (f"{r['ratio_to_decode_token']:>10.3f}" if model else ""))
    m = machine()
    print(f"machine: {m['processor']}, {m['cpu_count']} CPUs, torch {m['torch']} with {m['torch_threads']} thread(s)")
    doc = {"trace": trace_desc, "split": split, "test_tokens": test.num_tokens, "test_steps": steps, "machine": m,
           "model_forward": model, "predictors": rows}
    head = [f"{r['predictor']}: {r['us_per_token']:.2f} µs/token, top-k accuracy {r['top_k_accuracy']:.3f}"
            + (f", {r['ratio_to_decode_token']:.3f} x a decode token's forward" if model else "") for r in rows]
    if model:
        head.insert(0, f"model forward: prefill {model['prefill_us_per_token']:.1f} µs/token, decode batch "
                       f"{a.decode_batch}: {model['decode_us_per_token']:.1f} µs/token")
    out = write_bench("predictor_cost", title="Predictor cost: µs per token against the model's own forward",
                      headline=head, tables=[table(f"{trace_desc}; held out by {split}",
                                                   [{k: v for k, v in r.items() if k != "embedding"} for r in rows])],
                      data=doc, quick=a.quick, path=a.out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
