"""EP processes (issue 20, issue 24): a small EP 2 run through `routecast ep run`, the rendezvous on 127.0.0.1
only, one sentence naming a killed rank, and no rank outliving routecast (SIGTERM or SIGKILL to it).

On the built-in Mixtral model (8 experts, 4 MoE layers) with a tiny trace of its geometry: each rank
imports torch and loads the 18 MB checkpoint, so a launch costs a few seconds.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from routecast.cli import main
from routecast.common.errors import ConfigError
from routecast.models.builtin import builtin_path
from tests.conftest import build_small_trace

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    from routecast.trace.io import write_trace

    if not (builtin_path("builtin") / "model.safetensors").is_file():
        pytest.skip("builtin checkpoint absent")
    t = build_small_trace(num_requests=4, prompt_len=6, decode_len=3, num_layers=4, num_experts=8, top_k=2,
                          hidden=128)
    d = tmp_path_factory.mktemp("ep") / "trace"
    write_trace(dataclasses.replace(t, spec=dataclasses.replace(t.spec, name="builtin")), d)
    return d


def _ranks_of(marker: str) -> list[int]:
    """pids of live processes whose command line holds marker (the run's unique output path)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (p / "stat").read_text().split(") ")[1].split()[0]
            except OSError:
                continue
            if marker in cmd and "routecast.runtime.ep.worker" in cmd and state != "Z":
                out.append(int(p.name))
    return out


def _listening(pids: list[int]) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp* shows them) of the TCP sockets these processes listen on."""
    inodes = set()
    for pid in pids:
        with_fd = Path(f"/proc/{pid}/fd")
        for fd in with_fd.iterdir() if with_fd.exists() else ():
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:
                out.append(f[1].split(":")[0])
    return out


def test_ep2_one_plan_two_steps(trace_dir, tmp_path, capsys):
    out = tmp_path / "ep"
    rc = main(["ep", "run", "--model", "builtin", "--trace", str(trace_dir), "--plans", "static", "--steps", "2",
               "--repeats", "1", "--nproc", "2", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "rendezvous on 127.0.0.1" in text and "| True | True (" in text  # bytes == sim, outputs allclose
    assert not _ranks_of(str(out))


def test_a_killed_rank_is_named_in_one_sentence(trace_dir, tmp_path):
    from routecast.runtime.ep.launch import launch, prepare, select_steps
    from routecast.trace.io import read_trace

    tr = read_trace(trace_dir)
    out = tmp_path / "killed"
    cfg, _, _ = prepare(tr, model="builtin", trace_dir=str(trace_dir), out=out, method="static", nproc=2,
                        steps=select_steps(tr, 0, 2), save_outputs=False, kill={"rank": 1, "step": 1})
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        launch(cfg, 2)
    assert str(e.value) == "ep run rank 1 of 2 failed: it was killed by SIGKILL; the other ranks were stopped."
    assert time.monotonic() - t0 < 150 and not _ranks_of(str(out))


DRIVER = textwrap.dedent("""
    import sys
    import routecast.runtime.ep.run as run
    real = run.prepare
    run.prepare = lambda *a, **k: real(*a, **{**k, "kill": {"rank": 1, "step": 0, "mode": "hang"}})
    from routecast.cli import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_rank_outlives_routecast_and_the_store_listens_on_loopback(trace_dir, tmp_path, sig):
    out = tmp_path / f"ep-{sig.name}"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-c", DRIVER, "ep", "run", "--model", "builtin", "--trace", str(trace_dir), "--plans",
           "static", "--steps", "2", "--repeats", "1", "--nproc", "2", "--timeout", "300", "--out", str(out)]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (out / "static" / "fault-rank1").exists():  # rank 1 hangs at step 0: past the rendezvous
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.2)
        ranks = _ranks_of(str(out))
        assert len(ranks) == 2
        addrs = _listening(ranks)
        # 127.0.0.1 as /proc/net/tcp writes it (little-endian hex), or its IPv4-mapped IPv6 form
        assert addrs and all(a in ("0100007F", "0000000000000000FFFF00000100007F") for a in addrs), addrs
        p.send_signal(sig)
        _, err = p.communicate(timeout=30)
        t0 = time.monotonic()
        while _ranks_of(str(out)) and time.monotonic() - t0 < 10:
            time.sleep(0.1)
        assert not _ranks_of(str(out)), "ranks outlived routecast"
        if sig == signal.SIGTERM:
            assert p.returncode == 130 and err.strip().splitlines()[-1].startswith("routecast ep: interrupted")
            assert "Traceback" not in err
    finally:
        if p.poll() is None:
            p.kill()
        for pid in _ranks_of(str(out)):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("host", ["a" * 300, "a..b", "/tmp/trace/routing-00000.safetensors"])
def test_an_unusable_master_addr_is_one_sentence(host):
    from routecast.common.errors import ConfigError
    from routecast.runtime.ep.ranks import _listen

    with pytest.raises(ConfigError, match="--master-addr .*: cannot listen there"):
        _listen(host)
