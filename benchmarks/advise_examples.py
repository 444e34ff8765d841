"""`routecast advise` on the deployments the docs show: its table and verdict, generated, never typed.

Deployments (each on a standard trace, made on first use):
  mixtral-nvlink   Mixtral-8x7B on 4 x A100-80GB over NVLink, the mixtral-8x7b preset trace
  mixtral-pcie     the same over PCIe 4.0
  dsv3-ep32        DeepSeek-V3 on 32 x H100 (EP 32), the deepseek-v3 preset trace (16 requests; 64 without --quick)
  v2lite-half      DeepSeek-V2-Lite on one H100 with memory for half its routed experts (--memory-gb computed
                   here), priced on the built-in fine model's captured routing (same 64 experts, top-6; the trace's
                   5 MoE layers scale to the profile's 26)
  fine-cpu         the built-in fine model on this CPU (a `routecast calibrate --quick` profile of this machine)
Each prints the advisor's text output and keeps its JSON; all go into out/bench/advise_examples.json, which the
docs render (docs/stages/advise.md). Wall time of each is measured (the machine is shared: see the load average).

    PYTHONPATH=. python benchmarks/advise_examples.py [--quick] [--only NAME,...] [--hardware-cpu PROFILE.toml]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from routecast.common.bench import table, write_bench  # noqa: E402


def _half_memory_gb(model: str) -> float:
    """GB per GPU at which one GPU holds the dense weights and half the routed experts (advise.regime's rule)."""
    from routecast.advise.regime import KV_RESERVE, MEM_UTIL
    from routecast.serve.engine import weight_bytes
    from routecast.sim.models import load_model

    m = load_model(model)
    experts = m.num_moe_layers * m.num_experts * m.expert_bytes()
    return (weight_bytes(m, 0.0) + 0.5 * experts) / (MEM_UTIL * (1 - KV_RESERVE)) / 1e9


def deployments(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    from routecast.trace.standard import standard_trace

    dsv3 = lambda: standard_trace("deepseek-v3", requests=16 if args.quick else None, progress=False)  # noqa: E731
    return {
        "mixtral-nvlink": dict(trace=lambda: standard_trace("mixtral-8x7b", progress=False), model="mixtral-8x7b",
                               hardware="a100-sxm-80gb", gpus=4, link="nvlink"),
        "mixtral-pcie": dict(trace=lambda: standard_trace("mixtral-8x7b", progress=False), model="mixtral-8x7b",
                             hardware="a100-sxm-80gb", gpus=4, link="pcie"),
        "dsv3-ep32": dict(trace=dsv3, model="deepseek-v3", hardware="h100-sxm", gpus=32, link="nvlink",
                          shuffle=("sts",)),
        "v2lite-half": dict(trace=lambda: standard_trace("fine", progress=False), model="deepseek-v2-lite",
                            hardware="h100-sxm", gpus=1, memory_gb=_half_memory_gb("deepseek-v2-lite")),
        "fine-cpu": dict(trace=lambda: standard_trace("fine", progress=False), model="builtin-fine",
                         hardware=None, gpus=1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller DeepSeek-V3 trace (make bench)")
    ap.add_argument("--only", default=None, help="comma-separated deployment names (default: all)")
    ap.add_argument("--hardware-cpu", default=None, help="calibrated CPU profile for fine-cpu (default: calibrate here)")
    args = ap.parse_args()
    import torch

    from routecast.advise.run import advise_trace, make_deployment
    from routecast.trace.io import read_trace

    torch.set_num_threads(1)
    deps = deployments(args)
    names = args.only.split(",") if args.only else list(deps)
    results: dict[str, Any] = {}
    rows, head = [], []
    for name in names:
        d = deps[name]
        hw = d["hardware"]
        if hw is None:
            hw = args.hardware_cpu or "out/bench/advise_examples-cpu.toml"
            if not Path(hw).is_file():
                from routecast.sim.calibrate import calibrate

                calibrate(hw, device="cpu", threads=1, quick=True)
        path = d["trace"]()
        t0 = time.perf_counter()
        trace = read_trace(path, load_hidden=False, load_logits=False)
        dep = make_deployment(model_profile=d["model"], hardware=str(hw), gpus=d["gpus"], link=d.get("link", "nvlink"),
                              memory_gb=d.get("memory_gb"))
        v, _ = advise_trace(trace, dep, model_ref=d["model"], hw_ref=str(hw), shuffle_methods=d.get("shuffle"),
                            trace_path=path)  # as `routecast advise --trace`: router inputs read when the files hold them
        wall = time.perf_counter() - t0
        text = v.text()
        print(f"=== {name}\n$ routecast advise --trace {path} --model-profile {d['model']} --hardware {hw} "
              f"--gpus {d['gpus']}" + (f" --link {d['link']}" if "link" in d else "")
              + (f" --memory-gb {d['memory_gb']:.2f}" if "memory_gb" in d else "") + f"\n{text}\n({wall:.1f} s)\n",
              flush=True)
        results[name] = {**v.as_dict(), "text": text, "wall_s": wall, "trace": str(path),
                         "command": {k: (str(x) if not callable(x) else None) for k, x in d.items()}}
        best = v.best
        rows.append({"deployment": name, "setting": v.deployment, "best": best.cand.name if best else "none",
                     "gain vs nothing": best.gain if best else None, "wall s": wall})
        head.append(f"{name}: {v.sentences}")
    load = os.getloadavg()
    head.append(f"load average {load[0]:.1f} (2 shared cores)")
    write_bench("advise_examples", title="routecast advise on five deployments", headline=head,
                tables=[table("verdicts", rows)], data={"deployments": results}, quick=args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
