"""`routecast place export PLAN --format sglang|sglang-count --out FILE.json`: a plan in the JSON SGLang's
--init-expert-location reads, read back and compared before the command reports success.

PLAN is a method (static, eplb, moe-gps: computed from --trace's per-expert counts for --ep ranks) or a SGLang
file (.json / .pt) to convert. `--format sglang` writes
physical_to_logical_map; `sglang-count` writes the trace's (or a SGLang dump's) logical_count for SGLang's own
EPLB. Rows follow SGLang's indexing over all model layers (place/engines.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from routecast.common import numbers as N
from routecast.common.errors import ConfigError
from routecast.common.outputs import check_out_file, declare_inputs, write_atomic, writes
from routecast.place.engines import (
    loads_from_sglang,
    model_num_layers,
    plan_from_sglang,
    sglang_counts,
    sglang_mapping,
)


def build_parser() -> argparse.ArgumentParser:
    p = N.Parser(prog="routecast place export",
                                description="write a placement plan as SGLang's --init-expert-location JSON")
    p.add_argument("plan", help="static | eplb | moe-gps (from --trace), or a SGLang .json/.pt to convert")
    p.add_argument("--format", choices=("sglang", "sglang-count"), default="sglang",
                   help="sglang: physical_to_logical_map [layers, physical experts]; sglang-count: logical_count "
                        "[layers, logical experts] (default sglang)")
    p.add_argument("--trace", default=None, help="trace whose spec (and counts) the plan is for")
    p.add_argument("--ep", type=N.positive(4096), default=8, help="ranks (SGLang --ep-size) for a method plan (default 8)")
    p.add_argument("--redundant", type=N.nonneg(4096), default=1, help="EPLB / MoE-GPS redundant slots per rank (default 1)")
    p.add_argument("--model", default=None, help="checkpoint folder or built-in name, for num_hidden_layers "
                                                 "(default: the trace's model when it is built in)")
    p.add_argument("--num-layers", type=N.integer(1, 4096, why='layers of a model'), default=None, help="the model's num_hidden_layers (instead of --model)")
    p.add_argument("--out", required=True, help="output .json")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    return N.annotate_help(p)


def _num_layers(a: argparse.Namespace, spec) -> int:
    if a.num_layers is not None:
        if a.num_layers < 1:
            raise ConfigError(f"--num-layers {a.num_layers}; expected a positive layer count.")
        return a.num_layers
    from routecast.models.builtin import builtin_path, is_builtin_name

    model = a.model or (spec.name if spec is not None and is_builtin_name(spec.name) else None)
    if model is None:
        raise ConfigError("--model or --num-layers is missing; expected the model's layer count for SGLang's rows.")
    return model_num_layers(builtin_path(model) if is_builtin_name(model) else model)


@writes("--out")
def run_export(a: argparse.Namespace) -> int:
    """Handler; a.args holds the arguments after `place export`."""
    a = build_parser().parse_args(a.args)
    declare_inputs(a, ("plan", "--trace", "--model"))
    out = check_out_file(Path(a.out), "--out")  # refused when it exists (without --overwrite), is a link or an input
    spec = None
    if a.trace:
        from routecast.trace.io import read_trace

        trace = read_trace(a.trace, verify=False)
        spec = trace.spec
    n_layers = _num_layers(a, spec)
    if spec is not None and a.ep * a.redundant > spec.num_experts:
        raise ConfigError(f"--redundant {a.redundant} x --ep {a.ep} = {a.ep * a.redundant} redundant slots for "
                          f"{spec.num_experts} experts; expected at most one extra copy per expert ({spec.num_experts}).")
    src = Path(a.plan)
    if a.plan in ("static", "eplb", "moe-gps"):
        if spec is None:
            raise ConfigError(f"--trace is missing; expected a trace to compute the {a.plan} plan from.")
        from routecast.place.slot_plans import eplb_plan, moegps_plan, static_plan

        loads, ids = trace.counts_LE(), tuple(spec.layer_ids)
        plan = {"static": lambda: static_plan(spec.num_layers, spec.num_experts, a.ep, ids),
                "eplb": lambda: eplb_plan(loads, a.ep, redundant_per_rank=a.redundant, layer_ids=ids),
                "moe-gps": lambda: moegps_plan(loads, a.ep, redundant_per_rank=a.redundant, layer_ids=ids)}[a.plan]()
    elif src.suffix in (".json", ".pt"):
        if spec is None:
            raise ConfigError("--trace is missing; expected the trace whose MoE layers the SGLang file describes.")
        loads = loads_from_sglang(src, layer_ids=tuple(spec.layer_ids), num_experts=spec.num_experts) \
            if a.format == "sglang-count" else None
        plan = None if loads is not None else plan_from_sglang(src, layer_ids=tuple(spec.layer_ids),
                                                               num_experts=spec.num_experts, num_ranks=a.ep)
    else:
        why = " (PROBE plans change every step and leave empty slots, which SGLang cannot load)" if a.plan == "probe" else ""
        raise ConfigError(f"PLAN {a.plan!r} is neither a method (static, eplb, moe-gps) nor a .json/.pt file{why}.")
    if a.format == "sglang":
        doc = sglang_mapping(plan, n_layers)

        def same_plan(tmp: Path) -> None:  # read back BEFORE the rename: a bad file never replaces a good one
            back = plan_from_sglang(tmp, layer_ids=plan.layer_ids, num_experts=plan.num_experts, num_ranks=plan.num_ranks)
            if not np.array_equal(back.slots_LS, plan.slots_LS):
                raise ConfigError(f"--out {out}: the map read back differs from the plan; nothing was written.")

        write_atomic(out, json.dumps(doc), "--out", validate=same_plan)
        S = plan.num_slots
        print(f"wrote {out}: physical_to_logical_map [{n_layers} layers, {S} physical experts], MoE layers "
              f"{list(plan.layer_ids)}; read back: identical")
        print(f"SGLang: --init-expert-location {out} --ep-size {plan.num_ranks} "
              f"--ep-num-redundant-experts {S - plan.num_experts}")
        return 0
    if loads is None:
        loads = trace.counts_LE()
    ids = tuple(spec.layer_ids)
    doc = sglang_counts(loads, ids, n_layers)

    def same_loads(tmp: Path) -> None:
        back = loads_from_sglang(tmp, layer_ids=ids, num_experts=spec.num_experts)
        if not np.array_equal(back, np.rint(loads)):
            raise ConfigError(f"--out {out}: the counts read back differ from the loads; nothing was written.")

    write_atomic(out, json.dumps(doc), "--out", validate=same_loads)
    print(f"wrote {out}: logical_count [{n_layers} layers, {spec.num_experts} logical experts]; read back: identical")
    return 0
