"""Validate the layer cost model against a real MoE layer on this CPU.

Claim: calibrated on this machine (`routecast calibrate`), the cost model predicts the forward time of the
Hugging Face `MixtralSparseMoeBlock` (router + experts, eager expert loop, fp32, 1 thread) of the built-in
model's shape to within 20% mean absolute error across batch sizes.

Method: calibrate (full mode) -> profile TOML; build the block from the built-in config.json when it exists
(else hidden 256 / intermediate 512 / 8 experts / top-2), random weights (seed 0); for each batch size route
the batch through the block's router to get the per-expert token counts, predict the MoE-layer time with
`layer_cost` on one rank (FFN part: experts + fixed MoE overhead), and measure the block (median of
interleaved repeats). A second prediction with eta = 1 at every size (peak FLOP/s and memory bandwidth only)
shows what the measured efficiency curve contributes.

Run: python benchmarks/cost_model_validation.py [--quick] [--reps N]
Writes out/bench/cost_model_validation.json and out/bench/calibrated-cpu.toml.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from routecast.sim.calibrate import cache_flusher, calibrate, cpu_clock, expert_shape, median_times
from routecast.sim.cost import layer_cost, prefill
from routecast.sim.models import ModelProfile

BATCHES = (1, 8, 32, 128, 512)


def build_block(shape: dict[str, int], seed: int):
    """The HF MixtralSparseMoeBlock for `shape`, eager experts, random N(0, 0.02) weights."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    cfg = MixtralConfig(
        hidden_size=shape["hidden"], intermediate_size=shape["ffn"], num_local_experts=shape["experts"],
        num_experts_per_tok=shape["top_k"], num_attention_heads=4, num_key_value_heads=4,
    )
    cfg._experts_implementation = "eager"  # the block is used standalone, outside a PreTrainedModel
    torch.manual_seed(seed)
    block = MixtralSparseMoeBlock(cfg).eval()
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.02)
    return block


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="quick calibration (fewer token counts and repeats)")
    ap.add_argument("--reps", type=int, default=15, help="interleaved repeats per measured batch size")
    ap.add_argument("--out", default="out/bench", help="output directory")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shape = expert_shape()
    t0 = time.perf_counter()
    hw = calibrate(out / "calibrated-cpu.toml", device="cpu", threads=1, quick=args.quick)
    cal_s = time.perf_counter() - t0
    model = ModelProfile(
        name="validation-block", dtype_bytes=4, vocab_size=1, num_layers=1, hidden_size=shape["hidden"],
        num_experts=shape["experts"], top_k=shape["top_k"], expert_ffn=shape["ffn"], num_heads=4, num_kv_heads=4,
        head_dim=shape["hidden"] // 4,
    )
    block = build_block(shape, seed=0)
    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randn(1, b, shape["hidden"], generator=gen) for b in BATCHES]
    with torch.no_grad():
        counts = []
        for x in inputs:
            _, _, ids = block.gate(x.view(-1, shape["hidden"]))
            counts.append(torch.bincount(ids.flatten(), minlength=shape["experts"]).numpy().astype(np.float64))
        measured = median_times(
            [lambda x=x: block(x) for x in inputs], args.reps, clock=cpu_clock, flush=cache_flusher()
        )
    counts_CGE = np.stack(counts)[:, None, :]
    work = prefill(1, np.asarray(BATCHES, np.float64))
    predicted = layer_cost(counts_CGE, model=model, hw=hw, work=work).ffn
    flat = dataclasses.replace(hw, eta_tokens=(1.0,), eta_values=(1.0,), moe_layer_overhead=0.0)
    roofline = layer_cost(counts_CGE, model=model, hw=flat, work=work).ffn
    err = predicted / measured - 1.0
    err_roof = roofline / measured - 1.0
    mae = float(np.mean(np.abs(err)))

    print(f"machine: {hw.description}; torch {torch.__version__}, 1 thread, fp32; calibration {cal_s:.1f} s")
    print(f"block: hidden {shape['hidden']}, intermediate {shape['ffn']}, {shape['experts']} experts, top-{shape['top_k']}")
    print(f"profile: peak {hw.peak_flops / 1e9:.1f} GFLOP/s, memory {hw.mem_bandwidth / 1e9:.2f} GB/s, "
          f"MoE overhead {hw.moe_layer_overhead * 1e6:.0f} us")
    print(f"{'tokens':>6} {'active':>6} {'max n_e':>7} {'measured ms':>11} {'predicted ms':>12} {'error':>7} "
          f"{'peak-only ms':>12} {'error':>7}")
    rows = []
    for i, b in enumerate(BATCHES):
        c = counts[i]
        print(f"{b:>6} {int((c > 0).sum()):>6} {int(c.max()):>7} {measured[i] * 1e3:>11.3f} {predicted[i] * 1e3:>12.3f} "
              f"{err[i]:>+7.1%} {roofline[i] * 1e3:>12.3f} {err_roof[i]:>+7.1%}")
        rows.append({"tokens": b, "counts": c.astype(int).tolist(), "measured_s": float(measured[i]),
                     "predicted_s": float(predicted[i]), "error": float(err[i]),
                     "peak_only_s": float(roofline[i]), "peak_only_error": float(err_roof[i])})
    print(f"mean absolute error: {mae:.1%} (peak-only roofline: {float(np.mean(np.abs(err_roof))):.1%}); target <= 20%")
    result = {
        "machine": {"cpu": hw.description, "platform": platform.platform(), "torch": torch.__version__, "threads": 1},
        "shape": shape, "calibration_s": cal_s, "profile": str(out / "calibrated-cpu.toml"),
        "reps": args.reps, "rows": rows, "mean_abs_error": mae,
        "peak_only_mean_abs_error": float(np.mean(np.abs(err_roof))),
    }
    (out / "cost_model_validation.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
