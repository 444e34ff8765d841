"""The geometry runs' CPU expert compute: numba's bf16 SwiGLU loop against torch's bf16 matmul, per expert.

    python benchmarks/expert_kernel.py [--rounds 5] [--threads 2] [--quick]

For each production geometry (deepseek-v2-lite: 64 slots of 17 MB, rounds of 6 experts; mixtral-8x7b: 4 slots of
352 MB, rounds of 2), random bf16 pools larger than the caches, one decode token's input: every slot computed in
rounds by runtime/offload/expert_kernel.py's loop and by the torch code the geometry ran before it (x @ W.T in bf16,
as geometry.py's `--geometry-kernel torch`), in interleaved rounds. Prints ms per expert (median, min-max), the
weight bytes streamed per second, the ratio, each one's largest error against an fp64 reference relative to the
output's scale, and the memory's own rate (an fp32 sum over 1 GB: the ceiling); writes out/bench/expert_kernel.json.
"""

from __future__ import annotations

import argparse
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
from routecast.runtime.offload.expert_kernel import reference, swiglu_round, torch_expert  # noqa: E402
from routecast.runtime.offload.geometry import geometry  # noqa: E402

SETUPS = {"deepseek-v2-lite": (64, 6), "mixtral-8x7b": (4, 2)}  # slots in the pool, experts per round


def torch_round(gu: torch.Tensor, dn: torch.Tensor, slots: np.ndarray, w: np.ndarray, x: torch.Tensor) -> torch.Tensor:
    """The torch path of geometry.py: bf16 matmuls per expert (expert_kernel.torch_expert), fp32 sum."""
    out = torch.zeros(1, dn.shape[1])
    for s, wj in zip(slots.tolist(), w.tolist(), strict=True):
        out = out + torch_expert(gu, dn, s, wj, x)
    return out


def memory_rate(reps: int = 5) -> float:
    a = torch.ones(1 << 28)  # 1 GiB of fp32
    a.sum()
    t0 = time.perf_counter()
    for _ in range(reps):
        a.sum()
    return reps * a.numel() * 4 / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=N.positive(100), default=5, help="interleaved rounds (default 5; --quick 2)")
    ap.add_argument("--threads", type=N.threads(), default=2, help="torch and numba threads (default 2)")
    ap.add_argument("--quick", action="store_true", help="2 rounds, deepseek-v2-lite only")
    a = ap.parse_args(argv)
    import numba

    torch.set_num_threads(a.threads)
    numba.set_num_threads(min(a.threads, numba.config.NUMBA_NUM_THREADS))
    rounds = 2 if a.quick else a.rounds
    rows, mem = [], memory_rate()
    print(f"memory: {mem / 1e9:.1f} GB/s (fp32 sum over 1 GiB, {a.threads} threads)", flush=True)
    for name in (["deepseek-v2-lite"] if a.quick else list(SETUPS)):
        g, (S, R) = geometry(name), SETUPS[name]
        gen = torch.Generator().manual_seed(0)
        gu = (torch.randn(S, 2 * g.ffn, g.hidden, generator=gen) * 0.02).bfloat16()
        dn = (torch.randn(S, g.hidden, g.ffn, generator=gen) * 0.02).bfloat16()
        x = torch.randn(1, g.hidden, generator=gen).bfloat16()
        x32 = x[0].float().numpy().copy()
        w = np.full(R, 1.0 / R, np.float32)
        groups = [np.arange(j, j + R) % S for j in range(0, S, R)]
        out = np.zeros((R, g.hidden), np.float32)
        want = reference(gu, dn, groups[0], w, x32).sum(0)
        scale = np.abs(want).max()
        swiglu_round(gu, dn, groups[0], w, x32, out)  # compiles (or loads the cached build)
        err = {"numba": float(np.abs(out.sum(0) - want).max() / scale),
               "torch": float(np.abs(torch_round(gu, dn, groups[0], w, x)[0].numpy() - want).max() / scale)}
        times: dict[str, list[float]] = {"numba": [], "torch": []}
        for rep in range(rounds):
            for kern in (("numba", "torch") if rep % 2 == 0 else ("torch", "numba")):
                t0 = time.perf_counter()
                for sl in groups:
                    if kern == "numba":
                        swiglu_round(gu, dn, sl, w, x32, out)
                        out.sum(0)  # the layer's output, as geometry.py adds the rows
                    else:
                        torch_round(gu, dn, sl, w, x)
                times[kern].append((time.perf_counter() - t0) / (len(groups) * R))
        for kern, ts in times.items():
            med = statistics.median(ts)
            rows.append({"geometry": name, "kernel": kern, "ms_per_expert": med * 1e3, "ms_min": min(ts) * 1e3,
                         "ms_max": max(ts) * 1e3, "GB_per_s": g.expert_bytes / med / 1e9,
                         "x_torch": statistics.median(times["torch"]) / med, "rel_error": err[kern]})
            print(f"{name} {kern:5s} {med * 1e3:.3f} ms per expert ({min(ts) * 1e3:.3f}-{max(ts) * 1e3:.3f}), "
                  f"{g.expert_bytes / med / 1e9:.1f} GB/s, {rows[-1]['x_torch']:.2f}x torch, error {err[kern]:.1e} "
                  "of the output's scale", flush=True)
        del gu, dn
    by = {(r["geometry"], r["kernel"]): r for r in rows}
    head = [f"{n}: numba {by[(n, 'numba')]['ms_per_expert']:.3f} ms per expert against torch "
            f"{by[(n, 'torch')]['ms_per_expert']:.3f} ({by[(n, 'numba')]['x_torch']:.2f}x faster; "
            f"{by[(n, 'numba')]['GB_per_s']:.0f} against {by[(n, 'torch')]['GB_per_s']:.0f} GB/s of weights)"
            for n in dict.fromkeys(r["geometry"] for r in rows)]
    head.append(f"memory ceiling {mem / 1e9:.0f} GB/s (fp32 sum); median of {rounds} interleaved rounds, "
                f"{a.threads} threads; one decode token, bf16 weights, fp32 sums")
    for line in head:
        print(line)
    path = write_bench("expert_kernel", title="CPU expert compute of the geometry runs: numba bf16 loop vs torch",
                       headline=head, tables=[table("ms per expert (median of interleaved rounds)", rows)],
                       data={"memory_Bps": mem, "threads": a.threads, "rounds": rounds, "rows": rows}, quick=a.quick)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
