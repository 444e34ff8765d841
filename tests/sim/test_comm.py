"""s-MoE §3.2 communication volumes: golden values computed by hand; LAR -> a2a bytes -> layer time."""

import numpy as np
import pytest

from routecast.common.errors import ConfigError
from routecast.sim.comm import a2a_for_lar, comm_seconds, saving_closed_form, vol_alltoall, volume
from routecast.sim.cost import Workload
from routecast.sim.hardware import load_hardware
from routecast.sim.models import load_model


def test_volumes_by_hand():
    # G=2 ranks, B=1 sequence of S=8 tokens, k=2: AR = 2*1*8/2 = 8, AG = RS = 4, A2A(lar) = (1-lar)*2*8/2.
    assert vol_alltoall(2, 1, 8, 2, 0.5) == 4.0
    assert volume("ds-moe-ep", 2, 1, 8, 2) == 8 + 2 * 4 + 4  # AR + 2 A2A(1/G) + AG = 20
    assert volume("tp", 2, 1, 8, 2) == 16  # two all-reduces
    assert volume("s-moe", 2, 1, 8, 2, 0.75) == 4 + 2 * 2  # RS + 2 A2A(0.75) = 8
    # the paper's closed forms at k = 1: DS-MoE BS(3 - 1/G - 2/G^2) = 8 * 2 = 16; s-MoE BS(1 + (2k(1-a)-1)/G) = 6
    assert volume("ds-moe-ep", 2, 1, 8, 1) == 16
    assert volume("s-moe", 2, 1, 8, 1, 0.75) == 6
    sv = saving_closed_form(2, 1, 8, 1, 0.75)
    assert sv["vs_ds_moe_ep"] == 16 - 6 and sv["vs_tp"] == 16 - 6  # 8(2 - 1.5/2) = 10; 8(3 - 3.5/2) = 10


def test_closed_forms_match_the_sums_at_k1():
    G = np.array([2.0, 4, 8, 16])
    for lar in (0.0, 0.3, 1.0):
        ds = volume("ds-moe-ep", G, 3, 128, 1)
        assert np.allclose(ds, 3 * 128 * (3 - 1 / G - 2 / G**2))
        sm = volume("s-moe", G, 3, 128, 1, lar)
        assert np.allclose(sm, 3 * 128 * (1 + (2 * (1 - lar) - 1) / G))
        assert np.allclose(saving_closed_form(G, 3, 128, 1, lar)["vs_ds_moe_ep"], ds - sm)
        assert np.allclose(saving_closed_form(G, 3, 128, 1, lar)["vs_tp"], volume("tp", G, 3, 128, 1) - sm)


def test_seconds_by_hand():
    # token vector = 4 x 2 = 8 bytes, full tensor 64 B; B = 1e9 B/s, alpha = 1 us.
    t = comm_seconds("s-moe", 2, 1, 8, 2, 0.75, hidden=4, dtype_bytes=2, bandwidth=1e9, alpha=1e-6)
    rs = 1e-6 + 0.5 * 64 / 1e9
    a2a = 1e-6 + 2 * 8 / 1e9
    assert np.isclose(t, rs + 2 * a2a)
    t = comm_seconds("tp", 2, 1, 8, 2, 0.0, hidden=4, dtype_bytes=2, bandwidth=1e9, alpha=1e-6)
    assert np.isclose(t, 2 * (2 * 1e-6 + 2 * 0.5 * 64 / 1e9))


def test_a2a_for_lar_is_the_cost_model():
    m, hw = load_model("deepseek-v3"), load_hardware("h100-sxm")
    w = Workload(batch=4, seq_len=256)
    r = a2a_for_lar([0.125, 0.5, 1.0], model=m, hw=hw, ep=8, work=w)
    tokens = 4 * 256
    want_total = tokens * m.top_k * (1 - np.array([0.125, 0.5, 1.0])) * m.hidden_size * m.dtype_bytes
    assert np.allclose(r["a2a_bytes_total"], want_total)
    assert np.allclose(r["a2a_bytes_per_rank"], want_total / 8)
    assert r["a2a_s"][0] > r["a2a_s"][1] > r["a2a_s"][2] and np.all(np.diff(r["layer_s"]) < 0)


def test_bad_inputs():
    with pytest.raises(ConfigError, match="local activation rate"):
        vol_alltoall(2, 1, 8, 2, 1.5)
    with pytest.raises(ConfigError, match="scheme"):
        volume("dp", 2, 1, 8, 2)
    with pytest.raises(ConfigError, match="ep"):
        a2a_for_lar(0.5, model=load_model("deepseek-v3"), hw=load_hardware("h100-sxm"), ep=7)
