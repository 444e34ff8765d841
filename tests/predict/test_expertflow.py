"""ExpertFlow path predictor and its TLP/SLP baselines: they learn, respect their horizon, save and load;
batch-level accuracy at fixed batch sizes."""

import numpy as np
import pytest

from routecast.common.errors import ConfigError
from routecast.predict.batch_eval import batch_accuracy_rows, decode_batch_accuracy, decode_rows_RD
from routecast.predict.evaluate import PREDICTOR_NAMES, with_extra_training
from routecast.predict.expertflow import ExpertFlowConfig, ExpertFlowPredictor
from routecast.predict.forecast import multi_hot
from routecast.predict.frequency import ProbabilityPredictor
from routecast.predict.harness import check_no_leak, run_harness
from routecast.predict.locality import SLPPredictor, TLPPredictor
from routecast.predict.store import load_predictor, save_predictor
from routecast.trace import DECODE, MoESpec, Trace, make_columns
from tests.predict.conftest import build_routed_trace


def _acc(pred, test):
    return float(np.mean(run_harness(pred, test).metrics["top_k_accuracy"]))


@pytest.fixture(scope="module")
def split(routed_trace):
    tr = routed_trace(by="token", num_requests=40, prompt_len=8, decode_len=4, vocab=20, seed=5)
    return tr.split("request", (0.8, 0.2), seed=0)


@pytest.fixture(scope="module")
def fitted(split):
    train, _ = split
    cfg = ExpertFlowConfig(d_model=32, d_ff=64, epochs=25, batch_size=4, lr=3e-3)
    return ExpertFlowPredictor(train.spec, cfg).fit(train)


def test_expertflow_learns_token_routing_and_beats_the_probability_model(split, fitted):
    train, test = split
    prob = _acc(ProbabilityPredictor(train.spec).fit(train), test)
    ef = _acc(fitted, test)
    assert fitted.fit_log[-1] < fitted.fit_log[0]
    assert ef > prob + 0.2 and ef > 0.6, (ef, prob)


def test_expertflow_tlp_slp_do_not_leak(split, fitted):
    train, test = split
    assert check_no_leak(fitted, test, seed=1) == 4
    assert check_no_leak(TLPPredictor(train.spec).fit(train), test, seed=2) == 4
    assert check_no_leak(SLPPredictor(train.spec).fit(train), test, seed=3) == 4 * train.spec.num_layers


def test_expertflow_and_slp_save_and_load_to_identical_forecasts(split, fitted, tmp_path):
    train, test = split
    for pred in (fitted, SLPPredictor(train.spec).fit(train)):
        back = load_predictor(save_predictor(pred, tmp_path / pred.name))
        a = run_harness(pred, test, collect=True).forecasts
        b = run_harness(back, test, collect=True).forecasts
        assert all(np.array_equal(x.scores_TLE, y.scores_TLE) for (_, x), (_, y) in zip(a, b, strict=True))


def _chain_trace(T=400, L=3, E=6, seed=0) -> Trace:
    """Layer l's expert = (layer l-1's expert + 1) mod E: SLP's transition is exact; one token per step."""
    rng = np.random.default_rng(seed)
    e0 = rng.integers(0, E, T)
    experts = np.stack([(e0 + layer) % E for layer in range(L)], axis=1)[:, :, None].astype(np.int16)
    return Trace(spec=MoESpec(num_layers=L, num_experts=E, top_k=1),
                 tokens=make_columns(T, request=np.arange(T) // 10, position=np.arange(T) % 10, step=np.arange(T)),
                 experts_TLK=experts, weights_TLK=np.ones((T, L, 1), np.float32))


def test_slp_is_exact_on_a_layer_chain_and_tlp_repeats_the_previous_step():
    train, test = _chain_trace().split("request", (0.5, 0.5), seed=0)
    per_layer = run_harness(SLPPredictor(train.spec).fit(train), test).metrics["top_k_accuracy"]
    assert per_layer[1] == per_layer[2] == 1.0 and per_layer[0] < 0.6
    const = _chain_trace()
    const.experts_TLK[:] = 2
    res = run_harness(TLPPredictor(const.spec), const, collect=True)
    assert all(fc.batch_active_LE(1)[:, 2].all() for _, fc in res.forecasts[1:])


def test_decode_batches_group_b_requests_per_decode_index(routed_trace):
    tr = routed_trace(num_requests=12, prompt_len=3, decode_len=4, seed=2)
    rows = decode_rows_RD(tr)
    assert rows.shape == (12, 4) and (tr.tokens["phase"][rows] == DECODE).all()
    assert (np.diff(tr.tokens["position"][rows], axis=1) == 1).all()
    true = multi_hot(tr.experts_TLK, tr.spec.num_experts)
    assert decode_batch_accuracy(true, true, rows, 4) == 1.0
    assert decode_batch_accuracy(np.zeros_like(true), true, rows, 4) == 0.0
    assert np.isnan(decode_batch_accuracy(true, true, rows, 13))  # fewer requests than B
    # predicting one request's token for the whole batch recovers about a third of a 4-request batch's set
    one = np.zeros_like(true)
    one[rows[0]] = true[rows[0]]
    assert 0.0 < decode_batch_accuracy(one, true, rows, 4, perms=1) < 0.75


def test_tlp_predicts_each_requests_previous_token():
    """Requests whose every token routes to one fixed set per request: TLP is exact on decode tokens."""
    base = build_routed_trace(num_requests=10, prompt_len=4, decode_len=5, num_layers=2, num_experts=8, top_k=2)
    rng = np.random.default_rng(0)
    table = np.argsort(rng.random((10, 2, 8)), axis=-1)[..., :2].astype(np.int16)
    tr = Trace(spec=base.spec, tokens=base.tokens, experts_TLK=table[base.tokens["request"]],
               weights_TLK=base.weights_TLK, task_names=base.task_names)
    res = run_harness(TLPPredictor(tr.spec), tr, collect=True)
    pred = np.zeros((tr.num_tokens, 2, 8), bool)
    for (_, fc), (_, idx) in zip(res.forecasts, tr.batches(), strict=True):
        pred[idx] = multi_hot(fc.token_topk(len(idx)), 8)
    dec = tr.tokens["phase"] == DECODE
    true = multi_hot(tr.experts_TLK, 8)
    assert (pred[dec] == true[dec]).all()
    assert decode_batch_accuracy(pred, true, decode_rows_RD(tr), 5) == 1.0


def test_extra_training_shifts_requests_and_refuses_test_documents(routed_trace):
    tr = routed_trace(num_requests=6, prompt_len=3, decode_len=2)
    train, test = tr.select(tr.tokens["request"] < 4), tr.select(tr.tokens["request"] >= 4)
    both = with_extra_training(train, tr, test)
    assert both.num_tokens == train.num_tokens + tr.num_tokens
    assert len(np.unique(both.tokens["request"])) == 4 + 6
    docs = {"documents": ["d0", "d1"]}

    def with_docs(t, doc):
        cols = dict(t.tokens)
        cols["document"] = np.full(t.num_tokens, doc)
        return Trace(spec=t.spec, tokens=cols, experts_TLK=t.experts_TLK, weights_TLK=t.weights_TLK,
                     task_names=t.task_names, provenance=docs)

    with pytest.raises(ConfigError, match="source document"):
        with_extra_training(train, with_docs(tr, 1), with_docs(test, 1))
    assert with_extra_training(train, with_docs(tr, 0), with_docs(test, 1)).num_tokens == both.num_tokens
    other = routed_trace(num_requests=6, prompt_len=3, decode_len=2, num_experts=6)
    with pytest.raises(ConfigError, match="E=6"):
        with_extra_training(train, other, test)


def test_batch_accuracy_rows_name_every_size(split):
    train, test = split
    tr = Trace.concat([train, test])
    rows = batch_accuracy_rows(tr, ["tlp", "conditional-token"], sizes=(2, 4))
    assert [r["predictor"] for r in rows] == ["tlp", "conditional-token"]
    assert rows[1]["batch_4"] > rows[0]["batch_4"] and rows[0]["test_requests"] == 8
    assert {"expertflow", "tlp", "slp"} <= set(PREDICTOR_NAMES)
    assert multi_hot(np.array([[1, -1]]), 3).tolist() == [[False, True, False]]


def test_evaluate_adds_the_extra_training_trace(routed_trace):
    from routecast.predict.evaluate import evaluate

    tr = routed_trace(num_requests=20, prompt_len=4, decode_len=3, seed=7)
    other = routed_trace(num_requests=30, prompt_len=4, decode_len=3, seed=8)  # another token -> expert table
    plain = evaluate(tr, ["conditional-token"], progress=False, split="request")[0]
    more = evaluate(tr, ["conditional-token"], progress=False, split="request", extra_train=other)[0]
    assert "+ 210 of --train-extra" in more["fitted"] and "--train-extra" not in plain["fitted"]
    assert plain["top_k_accuracy"] == 1.0 > more["top_k_accuracy"]  # the extra routing was learned too


def test_paper_preset_and_config_strings():
    from routecast.predict.expertflow import paper_config, parse_config

    p = paper_config()
    assert (p.d_model, p.d_ff, p.lr, p.batch_size, p.weight_decay) == (32, 2048, 1e-3, 16, 0.01)
    assert parse_config("paper,epochs=12") == paper_config(epochs=12)
    assert parse_config("d_model=128,dec_layers=2,lr=0.001") == ExpertFlowConfig(d_model=128, dec_layers=2, lr=1e-3)
    assert parse_config("default") == ExpertFlowConfig()
    for bad, want in (("huge", "preset"), ("d_model=x", "not a number"), ("colour=3", "KEY=VALUE"),
                      ("epochs=0", "positive"), ("lr=-1", "lr")):
        with pytest.raises(ConfigError, match=want):
            parse_config(bad)


def test_length_batches_cover_every_request_once_with_less_padding():
    import torch

    from routecast.predict.expertflow import _length_batches

    lengths = np.random.default_rng(0).integers(10, 200, 103)
    batches = _length_batches(lengths, 8, 4, torch.Generator().manual_seed(0))
    assert sorted(np.concatenate(batches).tolist()) == list(range(103)) and len(batches) == 13
    assert max(len(b) for b in batches) == 8
    padded = sum(lengths[b].max() * len(b) for b in batches)
    plain = sum(lengths[b].max() * len(b) for b in _length_batches(lengths, 8, 1, torch.Generator().manual_seed(0)))
    assert padded < plain


def test_batch_rows_save_the_path_predictor_with_its_split(split, tmp_path):
    from routecast.predict.evaluate import check_fitted_on, trace_fingerprint
    from routecast.predict.expertflow import paper_config
    from routecast.predict.store import fitted_on

    train, test = split
    tr = Trace.concat([train, test])
    cfg = paper_config(d_ff=32, epochs=1)
    rows = batch_accuracy_rows(tr, ["expertflow"], sizes=(2,), split="request", expertflow=cfg,
                               extra_train=[train, train], save_expertflow=tmp_path / "ef")
    back = load_predictor(tmp_path / "ef")
    have = fitted_on(tmp_path / "ef")
    assert back.config.d_ff == 32 and back.config.d_model == 32 and have["extra_tokens"] == 2 * train.num_tokens
    assert have["split"] == "request" and rows[0]["train_tokens"] > 2 * train.num_tokens
    want = {"trace": trace_fingerprint(tr), "split": "request", "train_fraction": 0.8, "seed": 0}
    check_fitted_on(str(tmp_path / "ef"), want)  # the same split: accepted
    with pytest.raises(ConfigError, match="fitted on this trace"):
        check_fitted_on(str(tmp_path / "ef"), dict(want, seed=1))


def test_predict_fit_adds_the_extra_capture(routed_trace, tmp_path):
    from routecast.predict.evaluate import fit_and_save
    from routecast.predict.store import fitted_on

    tr = routed_trace(num_requests=10, prompt_len=4, decode_len=3, seed=3)
    other = routed_trace(num_requests=12, prompt_len=4, decode_len=3, seed=4)
    for split in ("request", "none"):
        d = fit_and_save(tr, "conditional-token", tmp_path / split, split=split, extra_train=other, progress=False)
        assert fitted_on(d)["extra_tokens"] == other.num_tokens and fitted_on(d)["split"] == split
    plain = load_predictor(fit_and_save(tr, "conditional-token", tmp_path / "plain", split="none", progress=False))
    more = load_predictor(tmp_path / "none")
    view = run_harness(plain, other, collect=True).forecasts[0][1].scores_TLE
    assert not np.array_equal(view, run_harness(more, other, collect=True).forecasts[0][1].scores_TLE)


def test_expertflow_kept_decoder_inputs_give_the_full_pass_logits(fitted):
    """A request extended one token at a time (encoder memory and decoder inputs kept) = one full pass."""
    import torch

    rng = np.random.default_rng(3)
    prompt, gen = rng.integers(0, 20, 8).tolist(), rng.integers(0, 20, 6).tolist()
    seq = prompt + gen
    net = fitted._net
    fitted.reset()
    with torch.inference_mode():
        full = net(torch.tensor([prompt]), torch.tensor([seq]))[0]
        parts = [fitted._extend(1, prompt, prompt, len(prompt))]
        parts += [fitted._extend(1, prompt, seq[:s], 1) for s in range(len(prompt) + 1, len(seq) + 1)]
        assert fitted._cache[1]["S"] == len(seq)
        again = fitted._extend(1, prompt, seq[:3] + [19, 19], 2)  # a different history: recomputed, not reused
        ref = net(torch.tensor([prompt]), torch.tensor([seq[:3] + [19, 19]]))[0, -2:]
    fitted.reset()
    assert torch.allclose(torch.cat(parts), full, atol=1e-5)
    assert torch.allclose(again, ref, atol=1e-5)
