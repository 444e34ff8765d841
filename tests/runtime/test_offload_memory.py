"""Offload memory (issue 20): peak RSS of an offloaded run at 25% is below the all-resident run's peak by at least
half the routed experts' bytes (each run in its own subprocess; its peak RSS minus its RSS after imports).

The peak is VmHWM from /proc/self/status, which belongs to the child's own address space. ru_maxrss would not do:
Linux carries it across fork + exec, so a child of a large pytest process (after the long fuzz test, 1.1 GB)
reports the parent's peak in both runs, and the test failed that way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import json, os, sys, torch
torch.set_num_threads(1)
import transformers.models.deepseek_v3.modeling_deepseek_v3
from routecast.runtime.offload.run import load_run, run_config
base_kb = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024  # after imports
name, budget = sys.argv[1], sys.argv[2]
offload = budget != "none"
_, _, spec, reqs = load_run(name, "corpus:val:1", 4, experts=not offload)
b = None if not offload else int(float(budget) * spec.num_layers * spec.num_experts)
r = run_config(name, reqs, budget=b)
hwm_kb = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:"))
print(json.dumps({"maxrss_kb": hwm_kb, "base_kb": base_kb,
                  "new_tokens": r["new_tokens"],
                  "routed_bytes": spec.num_layers * spec.num_experts * spec.expert_bytes}))
"""


def _peak(name: str, budget: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", CHILD, name, budget], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_offloaded_peak_rss_is_below_all_resident_by_half_the_routed_experts() -> None:
    ref = _peak("builtin-fine", "none")
    off = _peak("builtin-fine", "0.25")
    assert off["new_tokens"] == ref["new_tokens"] >= 1
    # peak growth over the RSS after imports (import-time noise between two interpreters cancels out)
    saved = ((ref["maxrss_kb"] - ref["base_kb"]) - (off["maxrss_kb"] - off["base_kb"])) * 1024
    assert saved >= ref["routed_bytes"] / 2, (ref, off)
