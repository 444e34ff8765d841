import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routecast.common.errors import TraceError
from routecast.trace import COLUMNS, MoESpec, Trace, make_columns


def _trace(T=12, L=3, E=8, K=2, seed=0, requests=4, steps=5, tasks=("a", "b")):
    rng = np.random.default_rng(seed)
    ids = np.argsort(rng.random((T, L, E)), axis=-1)[..., :K].astype(np.int16)
    return Trace(
        spec=MoESpec(num_layers=L, num_experts=E, top_k=K),
        tokens=make_columns(
            T,
            request=rng.integers(0, requests, T),
            step=np.sort(rng.integers(0, steps, T)),  # a request's later positions (rows) never run earlier
            task=rng.integers(0, len(tasks), T),
        ),
        experts_TLK=ids,
        weights_TLK=np.full((T, L, K), 1.0 / K, np.float32),
        task_names=tasks,
    )


def test_counts_LE_matches_loop():
    tr = _trace(T=50)
    c = tr.counts_LE()
    ref = np.zeros_like(c)
    for t in range(50):
        for l in range(3):
            for e in tr.experts_TLK[t, l]:
                ref[l, e] += 1
    assert (c == ref).all() and c.sum() == 50 * 3 * 2
    m = tr.step == 1
    assert tr.counts_LE(m).sum() == m.sum() * 6
    assert (tr.counts_LE(np.flatnonzero(m)) == tr.counts_LE(m)).all()


def test_dropped_slots_are_not_counted_and_set_no_bit():
    tr = _trace(T=4)
    tr.experts_TLK[0, 0, 1] = -1
    tr.validate()
    assert tr.counts_LE().sum() == 4 * 3 * 2 - 1
    hot = tr.paths_TLE(packed=False)
    assert hot[0, 0].sum() == 1 and hot.sum() == 4 * 3 * 2 - 1
    assert (np.unpackbits(tr.paths_TLE(), axis=-1)[..., :8].astype(bool) == hot).all()


def test_batches_in_step_order_and_requests_partition():
    tr = _trace(T=40)
    steps = [s for s, _ in tr.batches()]
    assert steps == sorted(set(tr.step.tolist()))
    idx = np.concatenate([i for _, i in tr.batches()])
    assert sorted(idx.tolist()) == list(range(40))
    for s, i in tr.batches():
        assert (tr.step[i] == s).all() and (np.diff(i) > 0).all()
    assert sum(len(i) for _, i in tr.requests()) == 40


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 60), st.integers(0, 1000), st.sampled_from([(0.5, 0.5), (0.8, 0.2), (0.6, 0.2, 0.2)]))
def test_split_by_request_conserves_tokens_and_keeps_requests_whole(T, seed, fr):
    tr = _trace(T=T, seed=seed, requests=7)
    parts = tr.split(by="request", fractions=fr, seed=seed)
    assert len(parts) == len(fr) and sum(len(p) for p in parts) == T
    seen = [set(p.request.tolist()) for p in parts]
    for i in range(len(seen)):
        for j in range(i + 1, len(seen)):
            assert not seen[i] & seen[j]
    merged = Trace.concat(parts)
    assert merged.counts_LE().tolist() == tr.counts_LE().tolist()


def test_split_by_task_and_select_and_repr():
    tr = _trace(T=30)
    a, b = tr.split(by="task", fractions=(0.5, 0.5), seed=1)
    assert set(a.task.tolist()).isdisjoint(b.task.tolist())
    sub = tr.select(tr.phase == 0)
    assert len(sub) == 30 and "T=30" in repr(sub)
    with pytest.raises(TraceError, match="by is"):
        tr.split(by="layer")
    with pytest.raises(TraceError, match="fractions"):
        tr.split(fractions=(0.5, 0.4))
    with pytest.raises(TraceError, match="mask has shape"):
        tr.select(np.ones(3, bool))


@pytest.mark.parametrize(
    "mutate, pattern",
    [
        (lambda kw: kw.update(experts_TLK=kw["experts_TLK"].astype(np.int32)), "dtype int32; expected int16"),
        (lambda kw: kw["experts_TLK"].__setitem__((0, 0, 0), 8), "expert id 8"),
        (lambda kw: kw["experts_TLK"].__setitem__((0, 0, 0), -2), "expert id -2"),
        (lambda kw: kw["weights_TLK"].__setitem__((1, 1, 1), np.nan), "NaN or inf"),
        (lambda kw: kw.update(weights_TLK=kw["weights_TLK"][:, :2]), "weights_TLK has shape"),
        (lambda kw: kw["tokens"].__setitem__("step", kw["tokens"]["step"][:3]), "'step' has shape"),
        (lambda kw: kw["tokens"].__setitem__("task", np.full(12, 5, np.int16)), "'task' holds 5"),
        (lambda kw: kw["tokens"].pop("phase"), "token columns are"),
        (lambda kw: kw.update(logits_TLE=np.zeros((12, 3, 7), np.float32)), "logits_TLE has shape"),
        (lambda kw: kw.update(hidden_TLH=np.zeros((12, 2, 4), np.float32)), "hidden_TLH has shape"),
    ],
)
def test_validation_names_the_field(mutate, pattern):
    tr = _trace()
    kw = dict(
        spec=tr.spec,
        tokens=dict(tr.tokens),
        experts_TLK=tr.experts_TLK.copy(),
        weights_TLK=tr.weights_TLK.copy(),
        task_names=tr.task_names,
    )
    mutate(kw)
    with pytest.raises(TraceError, match=pattern):
        Trace(**kw)


def test_spec_validation_and_round_trip():
    s = MoESpec(num_layers=2, num_experts=8, top_k=2, n_group=4, topk_group=2, layer_ids=(3, 5))
    assert MoESpec.from_dict(s.to_dict()) == s
    with pytest.raises(TraceError, match="top_k"):
        MoESpec(num_layers=1, num_experts=2, top_k=3)
    with pytest.raises(TraceError, match="layer_ids"):
        MoESpec(num_layers=2, num_experts=2, top_k=1, layer_ids=(0,))
    with pytest.raises(TraceError, match="n_group"):
        MoESpec(num_layers=2, num_experts=6, top_k=1, n_group=4)
    with pytest.raises(TraceError, match="unknown spec field"):
        MoESpec.from_dict({**s.to_dict(), "bogus": 1}, where="x/trace.json")
    with pytest.raises(TraceError, match="x/trace.json: spec field 'top_k' is missing"):
        MoESpec.from_dict({"num_layers": 1, "num_experts": 2}, where="x/trace.json")


def test_make_columns_defaults_and_errors():
    cols = make_columns(3, request=[1, 1, 2])
    assert set(cols) == set(COLUMNS) and cols["request"].dtype == np.int64 and cols["task"].tolist() == [-1] * 3
    with pytest.raises(TraceError, match="unknown token column"):
        make_columns(3, bogus=[1, 2, 3])
    with pytest.raises(TraceError, match="expected \\(3,\\)"):
        make_columns(3, step=[1, 2])


def test_shift_by_task_puts_the_first_tasks_first():
    t = _trace(T=40, requests=8, steps=10, seed=3)
    shifted, at = t.shift_by_task(["b"])
    assert shifted.num_tokens == t.num_tokens
    task, step, req = shifted.tokens["task"], shifted.tokens["step"], shifted.tokens["request"]
    first = task == t.task_names.index("b")
    assert step[first].max() < step[~first].min() and req[first].max() < req[~first].min()
    assert at == np.unique(step[first]).size and np.unique(step)[at] == step[~first].min()
    # Routing rows travel with their tokens.
    np.testing.assert_array_equal(shifted.counts_LE(), t.counts_LE())
    with pytest.raises(TraceError, match="not in the trace"):
        t.shift_by_task(["zzz"])
    with pytest.raises(TraceError, match="all"):
        t.shift_by_task(["a", "b"])
