"""The EP ranks as one process group on this machine: started together, watched, torn down together.

Legend: G ranks.

run_ranks() starts G `python -m MODULE CONFIG` processes (RANK, WORLD_SIZE, MASTER_ADDR / MASTER_PORT in
their environment), all in one new process group, and waits. It tears the whole group down (SIGTERM, then
SIGKILL after a grace period) when any rank fails, when the wall-clock limit passes, and when routecast
itself gets SIGINT or SIGTERM; the failure ends in one sentence naming the rank and the cause (the rank's
own `routecast ep: rank R: ...` line, or the signal that killed it). Each rank also asks the kernel to kill
it when routecast dies (PR_SET_PDEATHSIG), so even `kill -9` of routecast leaves no orphan ranks.

Rendezvous: routecast itself binds the listening socket of the ranks' TCPStore to `host` (default
127.0.0.1: this machine only) and hands it to rank 0 (TCPStore master_listen_fd), so the store never
listens on every interface as torchrun's does (torch binds its own store socket to `::`); gloo's sockets
stay on the loopback device too (GLOO_SOCKET_IFNAME=lo). `routecast ep --master-addr ADDR` changes it.

init_group() is the rank side: it joins that store and torch.distributed's process group.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from routecast.common.errors import ConfigError

LOOPBACK = "127.0.0.1"
ENV_FD, ENV_PARENT = "ROUTECAST_EP_STORE_FD", "ROUTECAST_EP_PARENT"
GRACE_S = 2.0  # after SIGTERM, before SIGKILL


def rank_command(module: str, config: Path | str) -> list[str]:
    """The command line every rank runs (this interpreter)."""
    return [sys.executable, "-m", module, str(config)]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _listen(host: str) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
        fam, _, _, _, addr = infos[0]
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(addr[:2])
        s.listen(128)
    except (OSError, UnicodeError, ValueError) as e:  # UnicodeError: an empty or over-long label (idna)
        raise ConfigError(f"--master-addr {host[:60]}: cannot listen there ({getattr(e, 'strerror', None) or e}); "
                          "expected an address of "
                          f"this machine (default {LOOPBACK}).") from None
    s.set_inheritable(True)
    return s


def start_ranks(module: str, config: Path | str, nproc: int, *, host: str = LOOPBACK,
                log_dir: Path | None = None) -> list[subprocess.Popen]:
    """Start the G ranks in one new process group (its id: rank 0's pid); stdout and stderr of rank r go to
    log_dir/rank<r>.log (pipes when log_dir is None)."""
    sock = _listen(host)
    port = sock.getsockname()[1]
    loop = host in ("127.0.0.1", "localhost", "::1")
    procs: list[subprocess.Popen] = []
    try:
        for r in range(nproc):
            env = _env() | {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(nproc), "MASTER_ADDR": host,
                            "MASTER_PORT": str(port), ENV_PARENT: str(os.getpid())}
            if loop:
                env["GLOO_SOCKET_IFNAME"] = "lo"
            if r == 0:
                env[ENV_FD] = str(sock.fileno())
            out = open(log_dir / f"rank{r}.log", "w") if log_dir is not None else subprocess.PIPE  # noqa: SIM115
            try:
                procs.append(subprocess.Popen(
                    rank_command(module, config), env=env, stdout=out, stderr=subprocess.STDOUT if log_dir else
                    subprocess.PIPE, text=True, pass_fds=(sock.fileno(),) if r == 0 else (),
                    process_group=0 if r == 0 else procs[0].pid))
            finally:
                if log_dir is not None:
                    out.close()
    except BaseException:
        stop(procs)
        raise
    finally:
        sock.close()  # rank 0 holds its own copy
    return procs


def stop(procs: list[subprocess.Popen]) -> None:
    """Tear the ranks' process group down: SIGTERM, then SIGKILL whatever is left after GRACE_S."""
    if not procs:
        return
    pgid = procs[0].pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        for p in procs:  # ranks outside the group (a failed setpgid) still get the signal
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(sig)
        t = time.monotonic() + GRACE_S
        while time.monotonic() < t and any(p.poll() is None for p in procs):
            time.sleep(0.02)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=1.0)


@contextlib.contextmanager
def _term_as_interrupt() -> Iterator[None]:
    """SIGTERM to routecast raises KeyboardInterrupt while the ranks run, so the finally clause stops them."""
    def handler(signum, frame):
        raise KeyboardInterrupt

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: SIGTERM keeps its handler
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _cause(code: int, log: Path) -> str:
    """Why a rank ended: its own one-sentence line, else the signal or exit code."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    mine = [ln.split(": ", 2)[-1] for ln in text.splitlines() if ln.startswith("routecast ep: rank")]
    if mine:
        return mine[-1].rstrip(".")
    if code < 0:
        return f"it was killed by {signal.Signals(-code).name}"
    return f"it exited with code {code}" + (f" ({text.splitlines()[-1][:160]})" if text.strip() else "")


def run_ranks(module: str, config: Path | str, nproc: int, *, host: str = LOOPBACK, wall_s: float = 600.0,
              what: str = "EP") -> None:
    """Start the ranks, wait for all of them; raise ConfigError naming the first rank that failed (the others
    are stopped) or the wall-clock limit. Everything started here is gone when this returns or raises."""
    with tempfile.TemporaryDirectory(prefix="routecast-ep-") as tmp:
        logs = Path(tmp)
        procs: list[subprocess.Popen] = []
        try:
            with _term_as_interrupt():
                procs = start_ranks(module, config, nproc, host=host, log_dir=logs)
                t0 = time.monotonic()
                while True:
                    codes = [p.poll() for p in procs]
                    bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
                    if bad:
                        # the rank that failed first: one killed by a signal, else the lowest that did not
                        # only report a peer's exit
                        first = min(bad, key=lambda r: (codes[r] >= 0, "peer" in _cause(codes[r], logs / f"rank{r}.log"), r))
                        cause = _cause(codes[first], logs / f"rank{first}.log")
                        stop(procs)
                        raise ConfigError(f"{what} rank {first} of {nproc} failed: {cause}; the other ranks were "
                                          "stopped.")
                    if all(c == 0 for c in codes):
                        return
                    if time.monotonic() - t0 > wall_s:
                        stop(procs)
                        raise ConfigError(f"{what} ranks ran past {wall_s:.0f} s and were stopped; expected them to "
                                          "finish (raise --timeout, or fewer --steps / --repeats).")
                    time.sleep(0.05)
        finally:
            stop(procs)


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this rank when the process that started it dies (Linux), and leave at once
    if it is already gone (the request does not cover a death before it was made)."""
    parent = os.environ.get(ENV_PARENT)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if parent and os.getppid() != int(parent):
        os._exit(1)


def init_group(backend: str, timeout_s: float) -> tuple[int, int]:
    """Rank side: join the store routecast bound (rank 0 serves it on the inherited socket) and the process
    group -> (rank, world size)."""
    from datetime import timedelta

    import torch.distributed as dist

    _die_with_parent()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = timedelta(seconds=float(timeout_s))
    fd = os.environ.get(ENV_FD)
    if rank == 0 and fd is None:
        raise ConfigError(f"rank 0 has no {ENV_FD}; expected to be started by routecast (runtime/ep/ranks.py).")
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=rank == 0,
                          timeout=timeout, wait_for_workers=False,
                          master_listen_fd=int(fd) if rank == 0 else None)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    return rank, world
