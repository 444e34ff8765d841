"""The demo report's ExpertFlow section on a tiny trace: rows per budget and policy, plot, re-batching, skips."""

import dataclasses
import math

from routecast.report.expertflow import BUDGETS, POLICIES, section_expertflow
from tests.conftest import build_small_trace


def _sized(tr):
    return dataclasses.replace(tr, spec=dataclasses.replace(tr.spec, expert_bytes=1 << 20))


def test_section_rows_plot_and_rebatch(tmp_path):
    sec, s = section_expertflow(_sized(build_small_trace(num_requests=10, num_experts=8)), tmp_path)
    assert (tmp_path / "expertflow_hit.png").stat().st_size > 0
    assert len(s["rows"]) == len(BUDGETS) * len(POLICIES)
    by = {(r["budget_pct"], r["policy"]): r for r in s["rows"]}
    for b in (25, 50, 75):
        assert by[(b, "lru")]["gap_closed_pct"] in (0, 0.0) or math.isnan(by[(b, "lru")]["gap_closed_pct"])
        assert by[(b, "belady")]["hit"] >= by[(b, "lfu")]["hit"]
        assert by[(b, "plec-correct")]["covered"] >= by[(b, "plec-correct")]["hit"]
    assert [r["method"] for r in s["rebatch"]] == ["arrival", "clustered"]
    html = "".join(sec.parts)
    assert "conditional-token" in html and "re-batching" in html and "Ranked by simulated time" in html
    at50 = [r["us_per_token"] for r in s["rows"] if r["budget_pct"] == 50]
    assert at50 == sorted(at50)  # fastest first


def test_section_skips_with_a_reason():
    _, s = section_expertflow(build_small_trace(num_requests=10, num_experts=8), "unused")
    assert "expert size" in s["skipped"]
    _, s = section_expertflow(_sized(build_small_trace(num_requests=1, num_experts=8)), "unused")
    assert "document" in s["skipped"]


def test_fc_evict_reads_the_reuse_probe_when_the_trace_has_router_inputs(tmp_path):
    sec, s = section_expertflow(_sized(build_small_trace(num_requests=10, num_experts=8, hidden=8)), tmp_path)
    assert "reading the reuse probe" in "".join(sec.parts)
    by = {(r["budget_pct"], r["policy"]): r for r in s["rows"]}
    assert by[(50, "fc-evict")]["hit"] <= by[(50, "belady")]["hit"] + 1e-12
    sec, _ = section_expertflow(_sized(build_small_trace(num_requests=10, num_experts=8)), tmp_path)
    assert "reading the reuse probe" not in "".join(sec.parts)
