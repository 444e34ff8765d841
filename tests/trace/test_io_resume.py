"""Kill-and-resume: a TraceWriter killed with SIGKILL keeps every committed shard, and resume completes it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from routecast.common.errors import TraceError
from routecast.trace.io import TraceWriter, read_shard, read_trace, write_trace
from routecast.trace.trace import Trace

TESTS = Path(__file__).resolve().parents[1]
NUM_REQUESTS = 40
TRACE_KW = dict(num_requests=NUM_REQUESTS, prompt_len=5, decode_len=3, num_layers=4, num_experts=16, top_k=2,
                logits=True, hidden=8, dropped=0.05, seed=11)

# The child writes one request per flush, slowly, and reports each commit on stdout; the parent kills it.
CHILD = f"""
import sys, time
sys.path.insert(0, {str(TESTS)!r})
from conftest import build_small_trace
from routecast.trace.io import TraceWriter
full = build_small_trace(**{TRACE_KW!r})
w = TraceWriter(sys.argv[1], full.spec, task_names=full.task_names, source_names=full.source_names,
                provenance=full.provenance, shard_tokens=1 << 20, overwrite=sys.argv[2] == "overwrite")
for r, idx in full.requests():
    sub = full.select(idx)
    w.append(sub.tokens, sub.experts_TLK, sub.weights_TLK, sub.logits_TLE, sub.hidden_TLH)
    w.flush()
    print(r, flush=True)
    time.sleep(0.05)
w.close()
print("done", flush=True)
"""


def _per_request(full: Trace) -> list[Trace]:
    return [full.select(idx) for _, idx in full.requests()]


def _run_and_kill(path: Path, mode: str, after: int) -> list[int]:
    """Start the child writer, SIGKILL it once `after` requests are reported committed; -> reported ids."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    seen: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(seen) < after and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(int(line))
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
    assert len(seen) == after, f"child wrote {seen} then stopped: {err}"
    assert proc.returncode == -signal.SIGKILL
    return seen


def _resume_and_finish(path: Path, full: Trace) -> list[int]:
    with TraceWriter(path, full.spec, task_names=full.task_names, source_names=full.source_names,
                     resume=True, overwrite=True) as w:
        done = w.committed_requests()
        assert w.num_tokens == int(np.isin(full.request, done).sum())
        for r, idx in full.requests():
            if r in done:
                continue
            sub = full.select(idx)
            w.append(sub.tokens, sub.experts_TLK, sub.weights_TLK, sub.logits_TLE, sub.hidden_TLH)
            w.flush()
    return done.tolist()


def test_sigkill_keeps_committed_shards_and_resume_completes(tmp_path, small_trace, assert_trace_equal):
    full = small_trace(**TRACE_KW)
    parts = _per_request(full)
    path = tmp_path / "cap"
    seen = _run_and_kill(path, "new", after=6)
    shards = sorted(path.glob("routing-*.safetensors"))
    # a kill between flush() and print() may leave one more shard than reported, never fewer
    assert len(seen) <= len(shards) <= len(seen) + 1 < NUM_REQUESTS
    assert not (path / "trace.json").exists() and (path / "_writer.json").exists()
    with pytest.raises(TraceError, match="never finished"):
        read_trace(path)
    for i, f in enumerate(shards):  # every committed shard reads back bit-identical
        assert_trace_equal(read_shard(f), parts[i], check_provenance=False)
    leftover = path / f".routing-{len(shards):05d}.safetensors.tmp-99999"
    leftover.write_bytes(b"half a shard")  # what a kill inside a shard write leaves behind
    done = _resume_and_finish(path, full)
    assert done == list(range(len(shards)))
    assert not leftover.exists()
    got = read_trace(path)
    assert_trace_equal(got, Trace.concat(parts), check_provenance=False)
    assert got.provenance == full.provenance  # kept from the interrupted writer's record


def test_killed_overwrite_leaves_old_trace_then_resume_swaps(tmp_path, small_trace, assert_trace_equal):
    full = small_trace(**TRACE_KW)
    old = small_trace(seed=5)
    path = tmp_path / "cap"
    write_trace(old, path)
    _run_and_kill(path, "overwrite", after=3)
    assert_trace_equal(read_trace(path), old)  # the finished trace is untouched by the killed overwrite
    assert (tmp_path / ".cap.partial").is_dir()
    _resume_and_finish(path, full)
    assert_trace_equal(read_trace(path), Trace.concat(_per_request(full)), check_provenance=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cap"]


def test_resume_checks_spec_names_and_shards(tmp_path, small_trace, assert_trace_equal):
    t = small_trace()
    path = tmp_path / "r"
    w = TraceWriter(path, t.spec, task_names=t.task_names, source_names=t.source_names)
    w.append(t.tokens, t.experts_TLK, t.weights_TLK)
    w.flush()
    w._release()  # as if the process died: the lock goes with it
    other = small_trace(num_experts=16)
    with pytest.raises(TraceError, match="_writer.json: field 'spec'"):
        TraceWriter(path, other.spec, task_names=t.task_names, source_names=t.source_names, resume=True)
    with pytest.raises(TraceError, match="field 'task_names'"):
        TraceWriter(path, t.spec, task_names=("x", "y"), source_names=t.source_names, resume=True)
    with pytest.raises(TraceError, match="exists and is not empty"):
        TraceWriter(path, t.spec, task_names=t.task_names, source_names=t.source_names)
    shard = path / "routing-00000.safetensors"
    shard.write_bytes(shard.read_bytes()[:-3])
    with pytest.raises(TraceError, match=r"routing-00000\.safetensors: file is"):
        TraceWriter(path, t.spec, task_names=t.task_names, source_names=t.source_names, resume=True)


def test_resume_of_finished_trace_and_of_nothing(tmp_path, small_trace, assert_trace_equal):
    t = small_trace()
    write_trace(t, tmp_path / "f", shard_tokens=16)
    with TraceWriter(tmp_path / "f", t.spec, task_names=t.task_names, source_names=t.source_names,
                     resume=True) as w:
        assert list(w.committed_requests()) == [0, 1, 2, 3] and w.num_tokens == t.num_tokens
    assert_trace_equal(read_trace(tmp_path / "f"), t)
    with TraceWriter(tmp_path / "new", t.spec, resume=True) as w:  # nothing to resume: starts fresh
        assert w.num_tokens == 0 and w.committed_requests().size == 0
    assert read_trace(tmp_path / "new").num_tokens == 0


def test_abort_of_a_resumed_writer_keeps_the_earlier_trace(tmp_path, small_trace, assert_trace_equal):
    t, extra = small_trace(seed=1), small_trace(2, seed=9)
    write_trace(t, tmp_path / "f")
    before = sorted(p.name for p in (tmp_path / "f").iterdir())
    w = TraceWriter(tmp_path / "f", t.spec, task_names=t.task_names, source_names=t.source_names, resume=True)
    w.append(extra.tokens, extra.experts_TLK, extra.weights_TLK)
    w.flush()
    assert (tmp_path / "f" / "routing-00001.safetensors").exists()
    w.abort()
    assert sorted(p.name for p in (tmp_path / "f").iterdir()) == before
    assert_trace_equal(read_trace(tmp_path / "f"), t)
