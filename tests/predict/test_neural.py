"""FFN and LSTM predictors: they learn token-determined routing, read model embeddings, and the LSTM's
step-by-step causal inference equals running each request's whole sequence at once."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from routecast.common.errors import ConfigError
from routecast.predict.embeddings import load_input_embeddings, resolve_model_dir
from routecast.predict.frequency import ProbabilityPredictor
from routecast.predict.harness import StepView, run_harness
from routecast.predict.neural import NeuralConfig, NeuralPredictor, RequestStates, ffn_preset, lstm_preset
from routecast.trace import MoESpec, Trace, make_columns


def _acc(pred, test):
    return float(np.mean(run_harness(pred, test).metrics["top_k_accuracy"]))


@pytest.fixture(scope="module")
def split(routed_trace):
    tr = routed_trace(by="token", num_requests=50, prompt_len=10, decode_len=4, vocab=30, seed=2)
    return tr.split("request", (0.8, 0.2), seed=0)


def test_ffn_and_lstm_beat_the_probability_model_on_token_routing(split):
    train, test = split
    prob = _acc(ProbabilityPredictor(train.spec).fit(train), test)
    ffn = NeuralPredictor(train.spec, ffn_preset(embedding="learned", epochs=8, lr=1e-2, batch_size=64, progress=False))
    lstm = NeuralPredictor(train.spec, lstm_preset(embedding="learned", epochs=8, lr=1e-2, batch_size=4, progress=False))
    a_ffn, a_lstm = _acc(ffn.fit(train), test), _acc(lstm.fit(train), test)
    assert prob < 0.6
    assert a_ffn > prob + 0.25, (a_ffn, prob)
    assert a_lstm > prob + 0.15, (a_lstm, prob)
    assert len(ffn.fit_log) >= 1 and ffn.fit_log[-1]["train_loss"] < ffn.fit_log[0]["train_loss"]


def _two_request_trace(token_ids_per_req, steps_per_req):
    """Requests given as token-id lists, with each token's step; rows sorted by step then request."""
    req = np.concatenate([np.full(len(t), r) for r, t in enumerate(token_ids_per_req)])
    pos = np.concatenate([np.arange(len(t)) for t in token_ids_per_req])
    tid = np.concatenate(token_ids_per_req)
    step = np.concatenate(steps_per_req)
    o = np.lexsort((pos, req, step))
    T = len(o)
    return Trace(spec=MoESpec(num_layers=3, num_experts=8, top_k=2),
                 tokens=make_columns(T, request=req[o], position=pos[o], token_id=tid[o], step=step[o]),
                 experts_TLK=np.tile(np.array([0, 1], np.int16), (T, 3, 1)), weights_TLK=np.full((T, 3, 2), 0.5, np.float32))


def _reference(pred, token_ids, W):
    """The LSTM predictor's function on one whole request, windowed causal attention, from zero state."""
    net = pred._net
    with torch.no_grad():
        x = F.relu(net.embed(torch.from_numpy(pred._rows(np.asarray(token_ids)))[None]))
        out, _ = net.lstm(x)
        i, j = torch.arange(len(token_ids))[:, None], torch.arange(len(token_ids))[None, :]
        att = F.scaled_dot_product_attention(out, out, out, attn_mask=(j <= i) & (i - j < W))
        return torch.softmax(net.heads(att + net.skip(x)).view(len(token_ids), 3, 8), -1).numpy()


@pytest.mark.parametrize("window", [512, 3])
def test_lstm_incremental_inference_equals_whole_sequences(split, window):
    train, _ = split
    pred = NeuralPredictor(train.spec, lstm_preset(embedding="learned", epochs=1, window=window, progress=False))
    pred.fit(train)
    seqs = [np.array([3, 7, 1, 4, 4, 9, 2, 8, 5]), np.array([6, 0, 2, 11, 5])]
    schedules = [
        [np.array([0, 0, 0, 0, 1, 2, 2, 2, 2]), np.array([0, 0, 1, 2, 2])],  # prefill, decode, chunk
        [np.arange(9), np.arange(5) + 2],  # one token per step, requests overlapping
        [np.zeros(9, int), np.zeros(5, int)],  # everything in one step
    ]
    for sched in schedules:
        tr = _two_request_trace(seqs, sched)
        res = run_harness(pred, tr, collect=True)
        got = np.concatenate([fc.scores_TLE for _, fc in res.forecasts])
        order = np.concatenate([idx for _, idx in tr.batches()])
        for r, toks in enumerate(seqs):
            mine = order[tr.request[order] == r]
            np.testing.assert_allclose(got[np.flatnonzero(tr.request[order] == r)][np.argsort(tr.position[mine])],
                                       _reference(pred, toks, window), atol=2e-5)


def test_request_states_drop_the_least_recently_used_request():
    st = RequestStates(layers=1, hidden=2, window=4, capacity=2)
    for r in (10, 11, 12):
        st.commit(np.array([r]), torch.ones(1, 1, 2), torch.ones(1, 1, 2), torch.ones(1, 1, 2), np.array([1]),
                  np.array([0]))
    *_, seen = st.gather(np.array([10, 11, 12]))
    np.testing.assert_array_equal(seen, [0, 1, 1])  # 10 was dropped; 11 and 12 each saw one token


def test_load_input_embeddings_by_name_and_errors(tmp_path):
    emb = torch.randn(20, 6, dtype=torch.bfloat16)
    save_file({"lm_head.weight": torch.randn(20, 6)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    save_file({"model.embed_tokens.weight": emb}, str(tmp_path / "model-00001-of-00002.safetensors"))
    got = load_input_embeddings(tmp_path)
    assert got.dtype == np.float32 and got.shape == (20, 6)
    np.testing.assert_array_equal(got, emb.float().numpy())
    with pytest.raises(ConfigError, match="none of the tensors"):
        load_input_embeddings(tmp_path, names=("encoder.weight",))
    with pytest.raises(ConfigError, match="does not exist"):
        load_input_embeddings(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no \\*.safetensors"):
        load_input_embeddings(tmp_path / "empty")
    assert resolve_model_dir(str(tmp_path)) == tmp_path
    assert resolve_model_dir(None, {"model_dir": str(tmp_path)}) == tmp_path
    assert resolve_model_dir("none", {"model_dir": str(tmp_path)}) is None
    with pytest.raises(ConfigError, match="no such directory"):
        resolve_model_dir(str(tmp_path / "nope"))


def test_model_embeddings_must_cover_the_trace_and_unfitted_predictors_refuse(split):
    train, _ = split
    small = np.zeros((10, 4), np.float32)  # the trace's ids reach 29
    with pytest.raises(ConfigError, match="has 10 rows"):
        NeuralPredictor(train.spec, ffn_preset(progress=False), embeddings=small).fit(train)
    with pytest.raises(ConfigError, match="none were given"):
        NeuralPredictor(train.spec, ffn_preset(progress=False)).fit(train)
    view = StepView(spec=train.spec, step=0, request=np.zeros(1, np.int64), position=np.zeros(1, np.int32),
                    token_id=np.zeros(1, np.int32), phase=np.zeros(1, np.int8), task=np.zeros(1, np.int16))
    with pytest.raises(ConfigError, match="not fitted"):
        NeuralPredictor(train.spec, ffn_preset(embedding="learned")).predict(view)
    with pytest.raises(ConfigError, match="window"):
        NeuralConfig(window=1)


def test_lstm_training_sequences_follow_each_request_in_step_order_cut_at_the_window():
    # request 0: tokens 10..14 over steps 0,0,1,2,3; request 1: tokens 20..22 in steps 1,1,2
    tr = _two_request_trace([np.arange(10, 15), np.arange(20, 23)], [np.array([0, 0, 1, 2, 3]), np.array([1, 1, 2])])
    pred = NeuralPredictor(tr.spec, lstm_preset(embedding="learned", window=2, progress=False))
    pred._vocab, pred._n_rows = np.arange(30), 31  # identity rows, as fit() would set for ids 0..29
    data = pred._batches_data(tr)
    np.testing.assert_array_equal(data["lengths"], [2, 2, 1, 2, 1])
    rows, experts = pred._batch(data, np.arange(5))
    np.testing.assert_array_equal(rows, [[10, 11], [12, 13], [14, 30], [20, 21], [22, 30]])  # 30 = padding row
    assert (experts[2, 1] == -1).all() and (experts[0, 0] >= 0).all()


def test_a_trace_captured_from_the_builtin_model_uses_its_embeddings(tmp_path, monkeypatch):
    import routecast.models.builtin as builtin

    monkeypatch.setattr(builtin, "builtin_path", lambda name="builtin": tmp_path / "missing")
    assert resolve_model_dir(None, {"model": "builtin"}) is None  # not trained yet: learned embeddings
    with pytest.raises(ConfigError, match="no trained checkpoint"):
        resolve_model_dir("builtin")
    save_file({"model.embed_tokens.weight": torch.zeros(4, 2)}, str(tmp_path / "model.safetensors"))
    monkeypatch.setattr(builtin, "builtin_path", lambda name="builtin": tmp_path / name)
    for name in ("builtin", "builtin-fine"):
        (tmp_path / name).mkdir()
        save_file({"model.embed_tokens.weight": torch.zeros(4, 2)}, str(tmp_path / name / "model.safetensors"))
    assert resolve_model_dir(None, {"tool": "routecast.trace.capture", "model": "builtin"}) == tmp_path / "builtin"
    # A builtin-fine trace uses builtin-fine's embeddings, not the built-in model's.
    assert resolve_model_dir(None, {"model": "builtin-fine"}) == tmp_path / "builtin-fine"
    assert resolve_model_dir("builtin-fine") == tmp_path / "builtin-fine"
    assert resolve_model_dir(None, {"model": "/some/other/model"}) is None
