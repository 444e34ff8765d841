import numpy as np
import pytest

from routecast.common.errors import ConfigError
from routecast.place.regimes import advise_placement, evaluate, regime_table, step_bounds, step_regime
from routecast.sim.cost import Workload
from routecast.sim.hardware import load_hardware
from routecast.sim.models import load_model

A100, MIX = load_hardware("a100-sxm-80gb"), load_model("mixtral-8x7b")
H100, DSV2 = load_hardware("h100-sxm"), load_model("deepseek-v2-lite")


def test_step_regimes():
    assert step_regime(np.array([1.0, 0.0, 0.3])).tolist() == ["prefill", "decode", "mixed"]


def test_bounds_by_hand():
    # Mixtral on A100, 2 ranks, one step: expert 0 has 2048 assignments, experts 1-3 and 5-7 one each (D = 7).
    # token bound    (2890.8 + 6 x 7.528) / 2 = 1468.0 us  (each term as in test_rank_roofline_golden_case_by_hand)
    # distinct bound ceil(7 / 2) = 4 reads x 215.99     =  863.96 us
    loads = np.array([[[2048, 1, 1, 1, 0, 1, 1, 1]]])
    b = step_bounds(loads, Workload(batch=1027, seq_len=1, context_len=0), ep=2, model=MIX, hw=A100)
    assert (b["tokens"] - b["distinct"])[0, 0] * 1e6 == pytest.approx(1468.0 - 863.96, rel=1e-3)
    np.testing.assert_array_equal(b["bound"], np.maximum(b["tokens"], b["distinct"]))


def _decode_loads(seed, T, L=2, E=64, K=6, tokens=16):
    rng = np.random.default_rng(seed)
    pop = rng.dirichlet(np.full(E, 0.3), size=L)
    out = np.zeros((T, L, E), np.int64)
    for lay in range(L):
        for t in range(T):
            for _ in range(tokens):
                out[t, lay, rng.choice(E, K, replace=False, p=pop[lay])] += 1
    return out


@pytest.fixture(scope="module")
def res():
    return evaluate(_decode_loads(0, 24), _decode_loads(1, 12), ep=8, replicas_per_rank=1, hw=H100, model=DSV2)


def test_no_method_beats_the_bound_and_every_method_is_priced(res):
    assert {"static", "eplb_once", "eplb_window", "probe_oracle", "probe_pred", "moe_gps", "coact", "coact_step",
            "coact_step_oracle"} <= set(res["moe_s_TL"])
    for name, v in res["moe_s_TL"].items():
        assert v.shape == (12, 2) and (v >= res["bounds"]["bound"] * (1 - 1e-9)).all(), name
    assert (res["regime_T"] == "decode").all()
    rows = regime_table(res)
    static = next(r for r in rows if r["method"] == "static")
    assert static["vs_static_pct"] == 0 and {r["method"] for r in rows} >= {"bound_tokens", "bound_distinct"}
    assert res["plan"].num_slots == 64 + 8


def test_advise_placement_on_step_loads():
    out = advise_placement(_decode_loads(2, 24), ep=8, hw=H100, model=DSV2)
    assert out["us"]["static"]["decode"] > 0 and out["us"]["static"]["prefill"] is None
    assert out["best"]["decode"][0] in out["us"] and out["plan"].num_slots == 72
    assert out["bounds"]["bound"]["decode"] <= min(v["decode"] for v in out["us"].values()) * (1 + 1e-9)
    with pytest.raises(ConfigError, match="slots"):
        advise_placement(_decode_loads(2, 4), ep=8, slots=70, hw=H100, model=DSV2)
    with pytest.raises(ConfigError, match="shape"):
        advise_placement(np.ones((1, 2, 64), np.int64), ep=8, hw=H100, model=DSV2)
