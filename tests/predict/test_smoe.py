"""s-MoE predictor: the token table, the device n-gram and Algorithm 2's confidence choice; the embedding
fallback for unseen tokens; no leak; save/load; listed in predict eval."""

import numpy as np
import pytest

from routecast.predict.evaluate import PREDICTOR_NAMES, evaluate
from routecast.predict.harness import check_no_leak, run_harness
from routecast.predict.smoe import SMoEConfig, SMoEPredictor, device_scores, majority_device, nearest_known
from routecast.predict.store import load_predictor, save_predictor
from routecast.trace import MoESpec, Trace, make_columns


def chain_trace(T=600, seed=0, vocab=30) -> Trace:
    """E=8 on G=4 (2 experts a rank), K=2, L=3. Layer 0 follows the token id (id % 4 -> rank); layers 1-2
    follow the previous layer's rank (rank r -> r+1 mod 4), whatever the token: the n-gram knows, the table not."""
    rng = np.random.default_rng(seed)
    tid = rng.integers(0, vocab, T)
    r0 = tid % 4
    ex = np.empty((T, 3, 2), np.int16)
    ranks = [r0, (r0 + 1 + (rng.random(T) < 0.5) * 2) % 4]  # layer 1: rank r+1 or r+3 at random (table can't tell)
    ranks.append((ranks[1] + 1) % 4)  # layer 2: always the rank after layer 1's
    for layer, r in enumerate(ranks):
        ex[:, layer, 0], ex[:, layer, 1] = 2 * r, 2 * r + 1
    per = 10
    return Trace(spec=MoESpec(num_layers=3, num_experts=8, top_k=2),
                 tokens=make_columns(T, request=np.arange(T) % per, position=np.arange(T) // per,
                                     step=np.arange(T) // per, token_id=tid),
                 experts_TLK=ex, weights_TLK=np.full((T, 3, 2), 0.5, np.float32))


@pytest.fixture(scope="module")
def fitted():
    tr = chain_trace()
    train, test = tr.split("request", (0.7, 0.3), seed=0)
    return SMoEPredictor(train.spec, SMoEConfig(ep=4)).fit(train), train, test


def test_table_for_layer0_ngram_for_layer2(fitted):
    pred, _, test = fitted
    res = run_harness(pred, test, collect=True)
    acc = res.metrics["top_k_accuracy"]
    assert acc[0] == 1.0  # token id decides layer 0
    assert acc[2] == 1.0  # the n-gram knows layer 2 from layer 1's rank
    assert 0.3 < acc[1] < 0.7  # two equally likely ranks: neither table can know
    dev = device_scores(res.forecasts, test, pred.group_LE, 4)
    assert dev["per_layer"]["device_accuracy"][2] == 1.0 and dev["per_layer"]["speculative_lar"][0] == 1.0


def test_no_leak(fitted):
    pred, _, test = fitted
    assert check_no_leak(pred, test, seed=4) == 4 * 3


def test_unseen_tokens_borrow_the_nearest_embedding():
    tr = chain_trace(vocab=8)
    emb = np.zeros((20, 3), np.float32)
    emb[np.arange(20), np.arange(20) % 3] = 1.0  # id v points along axis v % 3
    emb[12] = [0.1, 0.0, 1.0]  # nearest known: an id along axis 2 (2 or 5)
    p = SMoEPredictor(tr.spec, SMoEConfig(ep=4), embeddings=emb).fit(tr)
    near = nearest_known(np.array([12, 99]), p.table.keys_U, emb)
    assert p.table.keys_U[near[0]] in (2, 5) and near[1] == -1
    rows = p.token_rows(np.array([12, 2, 5]), 0)
    assert np.allclose(rows[0], rows[1]) or np.allclose(rows[0], rows[2])
    without = SMoEPredictor(tr.spec, SMoEConfig(ep=4)).fit(tr).token_rows(np.array([12]), 0)
    assert np.allclose(without[0], p.table.global_LE[0])  # no embeddings: the layer's global distribution


def test_majority_device_ties_go_low():
    g = np.array([0, 0, 1, 1])
    assert majority_device(np.array([[0, 2], [2, 3], [-1, 3]]), g, 2).tolist() == [0, 1, 1]


def test_save_load_round_trip(fitted, tmp_path):
    pred, _, test = fitted
    save_predictor(pred, tmp_path / "p")
    back = load_predictor(tmp_path / "p")
    a = run_harness(pred, test, collect=True).forecasts
    b = run_harness(back, test, collect=True).forecasts
    assert all(np.array_equal(x.scores_TLE, y.scores_TLE) for (_, x), (_, y) in zip(a, b, strict=True))


def test_listed_in_predict_eval():
    assert "smoe" in PREDICTOR_NAMES
    rows = evaluate(chain_trace(), "smoe", progress=False, split="request", model_dir="none")
    assert rows[0]["horizon"] == "layer" and rows[0]["top_k_accuracy"] > 0.7
