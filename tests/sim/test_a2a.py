"""sim.a2a: dispatch bytes of a locality-first plan (golden), the link fit, the shipped gloo profiles."""

from __future__ import annotations

import numpy as np
import pytest

from routecast.common.errors import ConfigError
from routecast.sim.a2a import LINK_DIR, LinkProfile, ep_a2a_bytes, fit_link, load_link


def test_bytes_golden():
    # 2 ranks, 2 experts; rank 0 holds 3 items of e0 and 1 of e1, rank 1 holds 2 of e1.
    local = np.array([[3, 1], [0, 2]])
    served = np.array([[3, 0], [0, 3]])  # static: e0 on rank 0, e1 on rank 1
    sent, recv = ep_a2a_bytes(local, served, 10)
    assert sent.tolist() == [10, 0] and recv.tolist() == [0, 10]
    with pytest.raises(ConfigError, match="equal per-expert totals"):
        ep_a2a_bytes(local, np.array([[3, 0], [0, 2]]), 10)


def test_fit_recovers_alpha_and_bandwidth():
    v = np.array([1e3, 1e4, 1e5, 1e6, 1e7])
    alpha, bw = fit_link(v, 50e-6 + v / 2e9)
    assert alpha == pytest.approx(50e-6, rel=1e-6) and bw == pytest.approx(2e9, rel=1e-6)
    with pytest.raises(ConfigError):
        fit_link([1e3], [1e-3])


def test_profile_round_trip(tmp_path):
    p = LinkProfile(name="x", backend="gloo", ranks=2, alpha=1e-4, bandwidth=1e9, sizes_bytes=(1.0, 2.0),
                    seconds=(1e-4, 2e-4))
    (tmp_path / "x.toml").write_text(p.to_toml())
    q = load_link(tmp_path / "x.toml")
    assert q.alpha == pytest.approx(1e-4) and q.bandwidth == pytest.approx(1e9) and q.ranks == 2
    assert float(q.time(1e9)) == pytest.approx(1.0 + 1e-4)
    (tmp_path / "bad.toml").write_text("name = 'b'\n")
    with pytest.raises(ConfigError, match="missing"):
        load_link(tmp_path / "bad.toml")
    with pytest.raises(ConfigError, match="not found"):
        load_link("no-such-link")


def test_shipped_gloo_profiles_load():
    names = sorted(p.stem for p in LINK_DIR.glob("*.toml"))
    assert names, "no measured link profile shipped"
    for n in names:
        prof = load_link(n)
        assert prof.backend == "gloo" and prof.bandwidth > 0 and len(prof.seconds) >= 2
