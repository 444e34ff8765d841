import numpy as np
import pytest

from routecast.common.errors import ConfigError
from routecast.trace.decode_batches import decode_batches
from routecast.trace.synth import SynthConfig, generate
from routecast.trace.trace import DECODE, PREFILL


@pytest.fixture(scope="module")
def src():
    cfg = SynthConfig(num_layers=2, num_experts=8, top_k=2, num_tokens=1500, token_budget=64, max_running=8,
                      prompt_len=(6.0,), output_len=(20.0,), seed=3)
    return generate(cfg)


@pytest.mark.parametrize("batch", [1, 5, 40])
def test_every_step_holds_one_decode_token_per_running_request(src, batch):
    d = decode_batches(src, batch=batch, steps=30, seed=1)
    assert (np.bincount(d.tokens["step"]) == batch).all() and (d.tokens["phase"] == DECODE).all()
    # a request runs in consecutive steps at consecutive positions
    for r in np.unique(d.tokens["request"]):
        m = d.tokens["request"] == r
        assert (np.diff(d.tokens["step"][m]) == 1).all() and (np.diff(d.tokens["position"][m]) == 1).all()
    # every row's routing is its source token's routing
    key = {(int(a), int(b)): i for i, (a, b) in enumerate(zip(src.tokens["document"], src.tokens["position"], strict=True))}
    rows = [key[(int(a), int(b))] for a, b in zip(d.tokens["document"], d.tokens["position"], strict=True)]
    np.testing.assert_array_equal(d.experts_TLK, src.experts_TLK[rows])
    again = decode_batches(src, batch=batch, steps=30, seed=1)
    np.testing.assert_array_equal(again.experts_TLK, d.experts_TLK)


def test_admitted_prompts_make_mixed_steps(src):
    d = decode_batches(src, batch=6, steps=60, seed=2, prefill=True)
    dec = np.bincount(d.tokens["step"], weights=d.tokens["phase"] == DECODE)
    pre = np.bincount(d.tokens["step"], weights=d.tokens["phase"] == PREFILL, minlength=dec.size)
    assert (dec == 6).all() and (pre > 0).any()
    # an admitted prompt joins the step of its first decode token, whole
    for r in np.unique(d.tokens["request"][d.tokens["phase"] == PREFILL]):
        m = d.tokens["request"] == r
        ph, st = d.tokens["phase"][m], d.tokens["step"][m]
        assert st[ph == PREFILL].min() == st[ph == PREFILL].max() == st[ph == DECODE].min()


def test_bad_input(src):
    for kw in ({"batch": 0, "steps": 3}, {"batch": 2, "steps": 0}, {"batch": 2.5, "steps": 3}):
        with pytest.raises(ConfigError):
            decode_batches(src, **kw)
    with pytest.raises(ConfigError, match="no decode"):
        decode_batches(src.select(src.tokens["phase"] == PREFILL), batch=2, steps=3)
