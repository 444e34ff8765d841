"""What to deploy, written under --out DIR: the engine files and the exact commands.

    write_artifacts(out_dir, verdict, ...) -> {name: path}

- sglang-init-expert-location.json: SGLang's `--init-expert-location` file (place.engines.sglang_mapping: one key
  physical_to_logical_map, int64, [num_hidden_layers, experts + redundant], dense layers included) of the chosen
  placement: EPLB of the first steps when EPLB one-shot wins, MoE-GPS's plan when it wins and fills every slot,
  else EPLB of the whole trace (the initial placement `--enable-eplb` starts from); sglang-flags.txt: the server
  flags that must go with it (SGLang checks only that the width divides --ep-size, so they must be exact);
- cocluster-plan.json + the `routecast permute-experts` command (Speculative MoE pre-grouping);
- the `routecast run --offload ...` line of the chosen cache policy and budget;
- serve-sim.json: the serving simulator's configuration with the chosen scheduler, and its command line;
- deploy.txt: every command above, one per line, with what it is for; verdict.json: the whole answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from routecast.advise.rank import Verdict
from routecast.common.bench import _clean as clean
from routecast.common.outputs import write_atomic
from routecast.place.engines import sglang_mapping
from routecast.place.slots import SlotPlan
from routecast.sim.models import ModelProfile

SGLANG_FILE = "sglang-init-expert-location.json"


def choose_plan(verdict: Verdict, plans: dict[str, SlotPlan]) -> tuple[str, SlotPlan]:
    """The slot plan SGLang should start from, given the best placement row (module docstring)."""
    best = verdict.best_of("placement")
    name = best.cand.name if best is not None else ""
    if name == "EPLB one-shot":
        return "eplb_once", plans["eplb_once"]
    if name == "MoE-GPS distribution duplication" and (plans["moe-gps"].slots_LS >= 0).all():
        return "moe-gps", plans["moe-gps"]
    if name == "static EP":
        return "static", plans["static"]
    return "eplb_window", plans["eplb_window"]


def sglang_flags(plan: SlotPlan, path: str, *, enable_eplb: bool) -> str:
    """The SGLang server flags that match `plan` exactly (EP size, redundant experts, the file)."""
    redundant = plan.num_slots - plan.num_experts
    flags = [f"--ep-size {plan.num_ranks}", f"--ep-num-redundant-experts {redundant}",
             f"--init-expert-location {path}"]
    if enable_eplb:
        flags.append("--enable-eplb")
    return " ".join(flags)


def write_artifacts(out_dir: str | Path, verdict: Verdict, *, model: ModelProfile, plans: dict[str, SlotPlan] | None,
                    shuffle: dict[str, Any] | None, serve_conf: dict[str, Any] | None, model_ref: str,
                    trace_ref: str) -> dict[str, str]:
    """Write every artifact that applies (module docstring) -> {artifact name: path}."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    cmds: list[str] = []
    if plans:
        which, plan = choose_plan(verdict, plans)
        p = out / SGLANG_FILE
        write_atomic(p, json.dumps(sglang_mapping(plan, model.num_layers)) + "\n", "--out")
        best = verdict.best_of("placement")
        windowed = best is not None and best.cand.name in ("EPLB windowed", "PROBE")
        flags = sglang_flags(plan, str(p), enable_eplb=windowed)
        write_atomic(out / "sglang-flags.txt", flags + "\n", "--out")
        files["sglang"] = str(p)
        files["sglang_flags"] = str(out / "sglang-flags.txt")
        path = model_ref if Path(model_ref).is_dir() else "MODEL_DIR"
        cmds.append(f"# SGLang, placement from {which} (MODEL_DIR: the Hugging Face checkpoint of {model.name}):\n"
                    f"python -m sglang.launch_server --model-path {path} {flags}")
    if shuffle and shuffle.get("plan") is not None:
        p = out / "cocluster-plan.json"
        write_atomic(p, shuffle["plan"].to_json(), "--out")
        files["cocluster_plan"] = str(p)
        cmds.append(f"# Speculative MoE: pre-group the experts by the {shuffle['method']} plan, then run EP with it:\n"
                    f"routecast permute-experts --model {model_ref} --plan {p} --out {out / 'permuted'}\n"
                    f"routecast ep run --model {model_ref} --trace {trace_ref} --nproc {shuffle['plan'].ep} "
                    f"--shuffle-plan {p}")
    cache = verdict.best_of("cache")
    if cache is not None and cache.cand.artifact.startswith("routecast run"):
        files["offload"] = cache.cand.artifact
        cmds.append(f"# offloaded inference, {cache.cand.name}:\n{cache.cand.artifact}")
    sched = verdict.best_of("scheduler")
    if serve_conf and sched is not None:
        conf = {**serve_conf, "scheduler": sched.cand.name}
        p = out / "serve-sim.json"
        write_atomic(p, json.dumps(conf, indent=1) + "\n", "--out")
        files["serve_sim"] = str(p)
        cmds.append(f"# serving simulator, scheduler {sched.cand.name}:\n" + serve_command(conf, trace_ref))
    write_atomic(out / "deploy.txt", "\n\n".join(cmds) + "\n", "--out")
    files["deploy"] = str(out / "deploy.txt")
    doc = clean({**verdict.as_dict(), "artifacts": files})
    write_atomic(out / "verdict.json", json.dumps(doc, indent=1, allow_nan=False) + "\n", "--out")
    files["verdict"] = str(out / "verdict.json")
    return files


def serve_command(conf: dict[str, Any], trace_ref: str) -> str:
    """The `routecast serve-sim` line that runs a serve-sim.json configuration."""
    return (f"routecast serve-sim --model-profile {conf['model_profile']} --hardware {conf['hardware']} "
            f"--gpus {conf['gpus']} --link {conf['link']} --budget {conf['budget']:.4g} --skewness "
            f"{conf['skewness']:.4g} --trace {trace_ref} --rate {conf['rate_req_s']:.4g} --scheduler "
            f"{conf['scheduler']} --slo-ttft {conf['slo_ttft']} --slo-tpot {conf['slo_tpot']} --period {conf['period']} "
            f"--token-budget {conf['token_budget']}")
