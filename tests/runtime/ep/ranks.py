"""Spawn G gloo ranks in fresh processes for the EP tests; kill any still running after the timeout."""

from __future__ import annotations

import multiprocessing as mp


def spawn_ranks(target, args_of, world: int, timeout: float = 90.0) -> tuple[list, list]:
    """Start target(*args_of(rank)) for every rank, join each; returns (processes, those that hung and were killed)."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=args_of(r)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    return procs, alive
