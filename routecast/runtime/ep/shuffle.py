"""Speculative MoE's token shuffle + expert pre-grouping (schedule/cocluster plans) applied to the EP runtime.

Legend: N trace rows, L MoE layers, E experts, G ranks.

A co-clustering plan (`routecast schedule cocluster TRACE --ep G --method smoe --respect-groups`) gives, per
layer, the rank of every expert (s-EG) and the rank every profiled token id is shuffled to (s-TS). As the paper
does, the runtime realises it as:
  experts  the plan's expert permutation (CoclusterPlan.expert_permutation_LE, what `routecast permute-experts`
           writes into a checkpoint) read as a SlotPlan: slot j of layer l holds old expert perm[l, j], so rank g
           holds exactly the plan's group g (one replica each; checked by schedule.permute.check_permutation, which
           also refuses a permutation that splits the router's expert groups);
  tokens   every trace row at layer l goes to CoclusterPlan.token_ranks (its id's rank, or its home rank when the
           plan never saw the id; home = the step's rows in G contiguous slices, cocluster.home_ranks, which is the
           runtime's default placement): a (N, L) token-rank table, one rank per row and layer.
The bytes the runtime then measures are sim.a2a's prediction for that routing and placement; with one replica
per expert they are also cocluster.evaluate_plan's remote assignments x H x 4 (fp32 rows): `expected` below.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from routecast.common.errors import ConfigError
from routecast.place.slots import SlotPlan
from routecast.schedule.cocluster import CoclusterPlan, evaluate_plan, home_ranks, read_plan
from routecast.schedule.permute import check_permutation

NAME = "shuffle"  # the plan's name in `ep run --plans` and the output folder


def load_shuffle(path: str | Path, trace: Any, nproc: int) -> tuple[CoclusterPlan, SlotPlan, np.ndarray]:
    """(cocluster plan, its SlotPlan, token_rank_NL int64) for `trace` on `nproc` ranks; ConfigError if the plan
    is for another EP size or trace geometry, or moves experts between router groups."""
    if not Path(path).is_file():
        raise ConfigError(f"--shuffle-plan {path}: no such file; expected a plan written by `routecast schedule cocluster`.")
    plan = read_plan(path, "--shuffle-plan")
    s = trace.spec
    if plan.ep != nproc:
        raise ConfigError(f"--shuffle-plan {path} is for --ep {plan.ep}; expected a plan made with --ep {nproc} "
                          f"(--nproc {nproc}).")
    perm_LE = check_permutation(plan.expert_permutation_LE(), s, f"--shuffle-plan {path}")
    slots = SlotPlan(slots_LS=perm_LE, share_LS=np.ones(perm_LE.shape), num_ranks=nproc, num_experts=s.num_experts,
                     layer_ids=tuple(s.layer_ids), method=NAME).validate(f"--shuffle-plan {path}")
    return plan, slots, token_ranks_NL(plan, trace)


def token_ranks_NL(plan: CoclusterPlan, trace: Any) -> np.ndarray:
    """(N, L) int64: the rank of every trace row at every MoE layer under the plan's token table."""
    home_N = home_ranks(np.asarray(trace.tokens["step"]), plan.ep)
    tid_N = np.asarray(trace.token_id, np.int64)
    return np.stack([plan.token_ranks(tid_N, home_N, lay) for lay in range(trace.spec.num_layers)], axis=1)


def expected(plan: CoclusterPlan, trace: Any, rows: np.ndarray) -> dict[str, float]:
    """schedule's own prediction on the replayed rows (int array): LAR and dispatch bytes of fp32 rows."""
    mask = np.zeros(trace.num_tokens, bool)
    mask[rows] = True
    ev = evaluate_plan(plan, trace, rows=mask, act_bytes=4)
    return {"lar": ev["lar"], "a2a_sent_bytes": int(round(sum(ev["per_layer"]["a2a_bytes"])))}
