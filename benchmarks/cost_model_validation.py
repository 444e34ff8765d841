"""Validate the layer cost model out of sample: calibrate, then predict MoE blocks of shapes never timed.

Claim: calibrated on this machine (`routecast calibrate`), the cost model predicts the forward time of the
Hugging Face `MixtralSparseMoeBlock` (router + experts, eager expert loop) to within 15% mean absolute
error on each expert shape, at every batch size from 1 to 512 tokens (CPU) or 1 to 16k tokens (GPU).

Method, repeated --repeats times (calibrate-then-validate each time, seeds 0, 1, ...; the spread over
repeats is what a user re-running it on this machine sees):
1. `calibrate` (full mode) -> profile TOML. Its shapes (sim/calibrate.py `cpu_plan` / `cuda_plan`) differ
   from every validation shape below, so no validated shape was timed during calibration.
2. For each validation shape build the block (random N(0, 0.02) weights, seed 0) and route each batch
   through its router to get per-expert token counts; predict the MoE-layer time with `layer_cost` on one
   rank (FFN part: expert calls + fixed MoE overhead); measure the block (median of interleaved repeats,
   every shape and batch in one sweep, caches flushed before each call).
A second prediction with eta = 1, no floors and the copy bandwidth (a peak-only roofline) shows what
calibration contributes.

CPU shapes (fp32, 1 thread, 8 experts, top-2): 384x1024 and 768x2048 (hidden x intermediate), and the
built-in model's 128x256. GPU shapes (bf16): Mixtral-8x7B 4096x14336 (8 experts, top-2) and DeepSeek-V3
7168x2048 (256 experts, top-8) expert geometry.

--profiles P1 P2 ... validates existing profiles instead (one repeat per profile, no calibration): this is
how a profile written by an older `routecast calibrate` is scored on the same shapes.

Run: python benchmarks/cost_model_validation.py [--device cpu|cuda] [--repeats 3] [--reps 15] [--quick]
Writes out/bench/cost_model_validation[-cuda].json and the calibrated profiles next to it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch

from routecast.common.bench import table, write_bench
from routecast.common.machine import machine_info
from routecast.sim.calibrate import cache_flusher, calibrate, cpu_clock, median_times
from routecast.sim.cost import layer_cost, prefill
from routecast.sim.hardware import Hardware, load_hardware
from routecast.sim.models import BUILTIN_CONFIG, ModelProfile

CPU_TOKENS = (1, 8, 32, 128, 512)
CUDA_TOKENS = (1, 16, 128, 1024, 4096, 16384)


def cpu_shapes() -> dict[str, dict[str, int]]:
    """Validation shapes on a CPU: two mid-size experts and the built-in model's (when its config exists)."""
    shapes = {
        "384x1024": {"hidden": 384, "ffn": 1024, "experts": 8, "top_k": 2},
        "768x2048": {"hidden": 768, "ffn": 2048, "experts": 8, "top_k": 2},
    }
    if BUILTIN_CONFIG.is_file():
        cfg = json.loads(BUILTIN_CONFIG.read_text())
        shapes["builtin"] = {"hidden": int(cfg["hidden_size"]), "ffn": int(cfg["intermediate_size"]),
                             "experts": int(cfg["num_local_experts"]), "top_k": int(cfg["num_experts_per_tok"])}
    return shapes


def cuda_shapes() -> dict[str, dict[str, int]]:
    """Validation shapes on a GPU: Mixtral-8x7B and DeepSeek-V3 expert geometry (routed experts only)."""
    return {
        "mixtral-8x7b": {"hidden": 4096, "ffn": 14336, "experts": 8, "top_k": 2},
        "deepseek-v3": {"hidden": 7168, "ffn": 2048, "experts": 256, "top_k": 8},
    }


def build_block(shape: dict[str, int], seed: int, device: str, dtype: torch.dtype):
    """The HF MixtralSparseMoeBlock for `shape` on `device`, eager experts, random N(0, 0.02) weights.

    Built directly on the device in `dtype` (DeepSeek-V3's 256 experts are 22 GB in bf16, 45 GB in fp32).
    """
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    cfg = MixtralConfig(
        hidden_size=shape["hidden"], intermediate_size=shape["ffn"], num_local_experts=shape["experts"],
        num_experts_per_tok=shape["top_k"], num_attention_heads=4, num_key_value_heads=4,
    )
    cfg._experts_implementation = "eager"  # the block is used standalone, outside a PreTrainedModel
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            block = MixtralSparseMoeBlock(cfg).eval()
    finally:
        torch.set_default_dtype(prev)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.02, generator=gen)
    return block


def profile_for(shape: dict[str, int], dtype_bytes: int) -> ModelProfile:
    """A one-layer ModelProfile with the block's expert geometry (attention fields unused here)."""
    return ModelProfile(
        name="validation-block", dtype_bytes=dtype_bytes, vocab_size=1, num_layers=1, hidden_size=shape["hidden"],
        num_experts=shape["experts"], top_k=shape["top_k"], expert_ffn=shape["ffn"], num_heads=4, num_kv_heads=4,
        head_dim=max(shape["hidden"] // 4, 1),
    )


def measure(shapes: dict[str, dict[str, int]], tokens: tuple[int, ...], device: str, reps: int):
    """({shape: (B, E) per-expert token counts}, {shape: (B,) measured seconds}) for every shape and batch.

    All blocks and batches are timed in one interleaved sweep, so drift on a shared machine hits all alike.
    """
    is_cuda = device.startswith("cuda")
    dtype = torch.bfloat16 if is_cuda else torch.float32
    gen = torch.Generator(device="cpu").manual_seed(1)
    fns, counts, keys = [], {}, []
    blocks = {}
    with torch.no_grad():
        for name, shape in shapes.items():
            block = blocks[name] = build_block(shape, seed=0, device=device, dtype=dtype)
            rows = []
            for b in tokens:
                x = torch.randn(1, b, shape["hidden"], generator=gen).to(device=device, dtype=dtype)
                _, _, ids = block.gate(x.view(-1, shape["hidden"]))
                rows.append(torch.bincount(ids.flatten(), minlength=shape["experts"]).cpu().numpy())
                fns.append(lambda blk=block, x=x: blk(x))
                keys.append(name)
            counts[name] = np.stack(rows).astype(np.float64)
        sync = (lambda: torch.cuda.synchronize(device)) if is_cuda else (lambda: None)
        clock = time.perf_counter if is_cuda else cpu_clock
        t = median_times(fns, reps, sync=sync, clock=clock, flush=cache_flusher(device))
    measured = {name: t[[i for i, k in enumerate(keys) if k == name]] for name in shapes}
    return counts, measured


def predict(hw: Hardware, shape: dict[str, int], counts_BE: np.ndarray, tokens: tuple[int, ...], dtype_bytes: int):
    """(calibrated prediction (B,), peak-only roofline (B,)) seconds of the MoE block on one rank."""
    model = profile_for(shape, dtype_bytes)
    work = prefill(1, np.asarray(tokens, np.float64))
    counts = counts_BE[:, None, :]
    cal = layer_cost(counts, model=model, hw=hw, work=work).ffn
    flat = dataclasses.replace(hw, eta_tokens=(1.0,), eta_values=(1.0,), moe_layer_overhead=0.0,
                               expert_call_overhead=0.0, activation_cost=0.0, weight_bytes=(), weight_bandwidth=(),
                               mem_derate=1.0)
    return cal, layer_cost(counts, model=model, hw=flat, work=work).ffn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N] (the GPU run needs ~30 GB of GPU memory)")
    ap.add_argument("--repeats", type=int, default=3, help="calibrate-then-validate rounds (seeds 0, 1, ...)")
    ap.add_argument("--quick", action="store_true", help="quick calibration (fewer points and repeats), 1 round, "
                                                          "5 timing repeats")
    ap.add_argument("--reps", type=int, default=15, help="interleaved timing repeats per measured batch")
    ap.add_argument("--profiles", nargs="+", help="validate these profile TOMLs instead of calibrating")
    ap.add_argument("--out", default="out/bench", help="output directory")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.reps = 1, min(args.reps, 5)
    torch.set_num_threads(1)
    is_cuda = args.device.startswith("cuda")
    if is_cuda and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: torch sees no CUDA GPU on this machine; use --device cpu.")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shapes, tokens = (cuda_shapes(), CUDA_TOKENS) if is_cuda else (cpu_shapes(), CPU_TOKENS)
    dtype_bytes = 2 if is_cuda else 4
    suffix = "-cuda" if is_cuda else ""
    rounds = []
    n_rounds = len(args.profiles) if args.profiles else args.repeats
    for r in range(n_rounds):
        t0 = time.perf_counter()
        if args.profiles:
            hw = load_hardware(args.profiles[r])
        else:
            hw = calibrate(out / f"calibrated{suffix}-{r}.toml", device=args.device, threads=1, quick=args.quick, seed=r)
        cal_s = time.perf_counter() - t0
        counts, measured = measure(shapes, tokens, args.device, args.reps)
        per_shape = {}
        for name, shape in shapes.items():
            pred, roof = predict(hw, shape, counts[name], tokens, dtype_bytes)
            m = measured[name]
            per_shape[name] = {"measured_s": m.tolist(), "predicted_s": pred.tolist(), "peak_only_s": roof.tolist(),
                               "error": (pred / m - 1).tolist(), "peak_only_error": (roof / m - 1).tolist(),
                               "max_tokens_per_expert": counts[name].max(axis=1).astype(int).tolist(),
                               "mae": float(np.mean(np.abs(pred / m - 1))),
                               "peak_only_mae": float(np.mean(np.abs(roof / m - 1)))}
        rounds.append({"profile": hw.source, "calibration_s": cal_s, "shapes": per_shape,
                       "expert_call_us": hw.expert_call_overhead * 1e6, "moe_layer_us": hw.moe_layer_overhead * 1e6,
                       "activation_ns": hw.activation_cost * 1e9})
        print(f"round {r}: profile {hw.source} ({cal_s:.0f} s); call floor {hw.expert_call_overhead * 1e6:.0f} us, "
              f"layer overhead {hw.moe_layer_overhead * 1e6:.0f} us, activation {hw.activation_cost * 1e9:.2f} ns/value")
        print(f"  {'shape':<14}" + "".join(f"{b:>9}" for b in tokens) + f"{'MAE':>8}{'peak-only':>11}")
        for name, row in per_shape.items():
            print(f"  {name:<14}" + "".join(f"{e:>+9.1%}" for e in row["error"])
                  + f"{row['mae']:>8.1%}{row['peak_only_mae']:>11.1%}")
        for name, row in per_shape.items():
            print(f"  {name:<14}" + "".join(f"{m * 1e3:>9.3f}" for m in row["measured_s"]) + "   measured ms")

    info = machine_info()
    print(f"\nmachine: {info['cpu']}" + (f", {torch.cuda.get_device_name(args.device)}" if is_cuda else "")
          + f"; torch {torch.__version__}, 1 thread, {'bf16' if is_cuda else 'fp32'}; {n_rounds} rounds, "
          f"{args.reps} timing repeats each; target: MAE <= 15% on every shape")
    print(f"{'shape':<14}{'MAE median':>11}{'min':>8}{'max':>8}{'peak-only median':>18}")
    summary, head = {}, []
    for name in shapes:
        maes = np.array([rd["shapes"][name]["mae"] for rd in rounds])
        roof = np.array([rd["shapes"][name]["peak_only_mae"] for rd in rounds])
        summary[name] = {"mae_median": float(np.median(maes)), "mae_min": float(maes.min()),
                         "mae_max": float(maes.max()), "peak_only_mae_median": float(np.median(roof)),
                         "within_target_all_rounds": bool(np.all(maes <= 0.15))}
        print(f"{name:<14}{np.median(maes):>11.1%}{maes.min():>8.1%}{maes.max():>8.1%}{np.median(roof):>18.1%}")
        head.append(f"{name}: mean absolute error {np.median(maes):.1%} (median of {n_rounds} rounds, "
                    f"{maes.min():.1%}-{maes.max():.1%}); peak-only roofline {np.median(roof):.1%}; target <= 15%")
    result = {"benchmark": "cost_model_validation", "device": args.device, "machine": info, "tokens": list(tokens),
              "shapes": shapes, "reps": args.reps, "quick": args.quick, "rounds": rounds, "summary": summary,
              "profiles_given": bool(args.profiles)}
    name = f"cost_model_validation{suffix}{'-profiles' if args.profiles else ''}"
    err_rows = [{"round": i, "shape": sh, **{f"{b} tok": e for b, e in zip(tokens, row["error"], strict=True)},
                 "MAE": row["mae"], "peak-only MAE": row["peak_only_mae"]}
                for i, rd in enumerate(rounds) for sh, row in rd["shapes"].items()]
    path = write_bench(name, title=f"Cost model out of sample on {args.device}: predicted vs measured MoE block time",
                       headline=head, tables=[table("prediction error per batch size (tokens)", err_rows)],
                       data=result, quick=args.quick, path=out / f"{name}.json")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
