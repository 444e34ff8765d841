"""Generation runs: all-resident or offloaded, greedy, one request or a left-padded batch at a time, with figures.

``generate_all`` is the loop both configurations share (so their tokens compare one to one);
``run_config`` builds a fresh model + store for one (budget, prefetch) configuration, runs the prompts
and returns tokens/s, hit ratio, bytes read, stall share and the access log for the replay;
``generations`` decodes a run's text per request; ``write_profile`` measures the disk tier and writes the
hardware profile `cache replay` prices misses with (`routecast run --write-profile`).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from routecast.common.errors import ConfigError
from routecast.runtime.offload.engine import PREFETCHERS, OffloadConfig, OffloadedModel
from routecast.runtime.offload.load import load_without_experts, model_path

SWITCH_S = 0.0005  # GIL switch interval while loader threads run


def encode_prompts(tokenizer: Any, prompts: Sequence[dict[str, Any]], max_new_tokens: int | None) -> list[tuple[list[int], int]]:
    """Prompt records -> (token ids, new-token budget) per request (the record's budget unless max_new_tokens)."""
    out = []
    for r in prompts:
        ids = tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]
        if not ids:
            raise ConfigError(f"--prompts: request {r.get('request', len(out))} has an empty prompt; expected text.")
        out.append((list(ids), int(max_new_tokens if max_new_tokens is not None else r.get("max_new_tokens", 32))))
    return out


def load_run(model_name: str, prompts: str, max_new_tokens: int | None, *,
             experts: bool = True) -> tuple[Any, Any, Any, list[tuple[list[int], int]]]:
    """`--model` and `--prompts` of a run -> (model, tokenizer, its TraceSpec, encoded requests). experts=False: the
    model without its routed experts' bytes (load.load_without_experts: enough for the spec and PROBE's gates)."""
    from routecast.trace.capture_arch import spec_from_model
    from routecast.trace.capture_inputs import load_model, load_prompts

    model, tok = load_model(model_name) if experts else load_without_experts(model_name)
    return model, tok, spec_from_model(model), encode_prompts(tok, load_prompts(prompts, tok), max_new_tokens)


def generate_all(model: torch.nn.Module, tokenizer: Any, requests: Sequence[tuple[list[int], int]], *,
                 offloaded: OffloadedModel | None = None, progress: bool = False, desc: str = "generate",
                 batch_size: int = 1, switch_s: float = SWITCH_S, logits: bool = False) -> dict[str, Any]:
    """Greedy generation of every request, `batch_size` at a time (left-padded, as capture does) -> {'tokens':
    [[new ids]...], 'wall_s', 'new_tokens', 'prompt_tokens'} (+ 'logits': per request a float32 tensor (new tokens,
    vocab) of the logits every generated token was chosen from, when `logits`). A batch runs to its longest budget; each request
    keeps its own budget's tokens, cut after its first EOS. Wall time covers prefill and decode of all requests
    (tokenisation excluded). switch_s: the GIL switch interval while an offloaded run's loader threads run."""
    from tqdm.auto import tqdm

    from routecast.trace.capture import _generation_setup, _pad

    if batch_size < 1:
        raise ConfigError(f"--batch-size is {batch_size}; expected at least 1.")
    gc, pad, eos = _generation_setup(model, tokenizer)
    gc.output_logits = gc.return_dict_in_generate = logits
    outs, new, prompt, step_logits = [], 0, 0, []
    switch = sys.getswitchinterval()
    if offloaded is not None:  # loader threads hand the GIL back sooner (default 5 ms stalls the forward)
        sys.setswitchinterval(switch_s)
    batches = [requests[i:i + batch_size] for i in range(0, len(requests), batch_size)]
    t0 = time.perf_counter()
    with torch.no_grad():
        for batch in tqdm(batches, desc=desc, disable=not progress, unit="batch" if batch_size > 1 else "request"):
            if offloaded is not None:
                offloaded.new_request(len(batch))
            if len(batch) == 1:
                x, mask = torch.tensor([batch[0][0]], dtype=torch.long), None
            else:
                ids_np, mask_np = _pad([ids for ids, _ in batch], pad, left=True)
                x, mask = torch.from_numpy(ids_np), torch.from_numpy(mask_np)
            gc.max_new_tokens = max(b for _, b in batch)
            seq = model.generate(input_ids=x, attention_mask=torch.ones_like(x) if mask is None else mask,
                                 generation_config=gc)
            if logits:
                seq, lg = seq.sequences, torch.stack(seq.logits, 1).float()  # (B, steps, V)
            for row, (ids, budget) in enumerate(batch):
                got = seq[row, x.shape[1]:x.shape[1] + budget].tolist()
                if len(batch) > 1:
                    stop = next((i for i, t in enumerate(got) if t in eos), None)
                    got = got if stop is None else got[:stop + 1]
                outs.append(got)
                if logits:
                    step_logits.append(lg[row, :len(got)].clone())
                new += len(got)
                prompt += len(ids)
    wall = time.perf_counter() - t0
    sys.setswitchinterval(switch)
    res = {"tokens": outs, "wall_s": wall, "new_tokens": new, "prompt_tokens": prompt}
    if logits:
        res["logits"] = step_logits
    return res


def logits_match(ref: Sequence[torch.Tensor], got: Sequence[torch.Tensor], *, rtol: float = 1e-4,
                 atol: float = 1e-4) -> tuple[bool, float]:
    """Every generation step's logits of `got` (per request (steps, vocab), generate_all(logits=True)) allclose to
    `ref`'s -> (all close, largest absolute difference). Different step counts are a mismatch (inf)."""
    if len(ref) != len(got) or any(a.shape != b.shape for a, b in zip(ref, got, strict=False)):
        return False, float("inf")
    diff = max((float((a - b).abs().max()) for a, b in zip(ref, got, strict=True) if a.numel()), default=0.0)
    return all(torch.allclose(a, b, rtol=rtol, atol=atol) for a, b in zip(ref, got, strict=True)), diff


def make_predictor(name: str, model: torch.nn.Module, model_dir: str | Path, *, predictor_dir: str | Path | None = None,
                   fit_trace: str | Path | None = None, seed: int = 0, threads: int = 1) -> Any:
    """The forecaster behind --prefetch: None for 'none'; a saved predictor (predictor_dir), one fitted on
    fit_trace, or for 'lookahead' without either PROBE's untrained frozen-gate prior cloned from the model."""
    if name not in PREFETCHERS:
        raise ConfigError(f"--prefetch is {name!r}; expected one of {', '.join(PREFETCHERS)}.")
    if name == "none":
        return None
    from routecast.trace.capture_arch import spec_from_model

    spec = spec_from_model(model)
    if predictor_dir is not None:
        from routecast.predict.store import is_predictor_dir, load_predictor

        if not is_predictor_dir(predictor_dir):
            raise ConfigError(f"--predictor {predictor_dir}: not a folder written by `routecast predict fit`.")
        pred = load_predictor(predictor_dir)
        if pred.name != name:
            raise ConfigError(f"--predictor {predictor_dir} holds a {pred.name!r} predictor; --prefetch asks for {name!r}.")
    elif fit_trace is not None:
        from routecast.predict.evaluate import NEEDS_ROUTER_INPUTS, fit_or_load
        from routecast.trace.io import read_trace

        routers = name in NEEDS_ROUTER_INPUTS
        trace = read_trace(fit_trace, load_hidden=routers, load_logits=routers)
        pred = fit_or_load(name, trace, model=str(model_dir), seed=seed, threads=threads, quiet=True)
    elif name == "lookahead":
        from routecast.predict.lookahead import LookaheadPredictor

        pred = LookaheadPredictor.from_model(model, spec)
    else:
        raise ConfigError(f"--prefetch {name} needs a fitted predictor; pass --predictor DIR (from `routecast "
                          "predict fit`) or --fit-trace TRACE (a capture of this model to fit it on).")
    if (pred.spec.num_layers, pred.spec.num_experts) != (spec.num_layers, spec.num_experts):
        raise ConfigError(f"--prefetch {name}: the predictor was built for L={pred.spec.num_layers}, "
                          f"E={pred.spec.num_experts}; the model has L={spec.num_layers}, E={spec.num_experts}.")
    pred.reset()
    return pred


def accesses_from_log(log: Sequence[tuple[int, np.ndarray, np.ndarray]], L: int, E: int, num_tokens: int):
    """The runtime's access log (layer, experts, tokens per expert) -> replay.Accesses (the same accesses the
    runtime served, in its order: every forward step is L accesses in layer order)."""
    from routecast.cache import kernel as K
    from routecast.cache.replay import Accesses

    if len(log) % L:
        raise ConfigError(f"the access log holds {len(log)} accesses, not a whole number of {L}-layer steps.")
    keys = [lay * E + ex for lay, ex, _ in log]
    counts = [c for _, _, c in log]
    req_off = np.concatenate([[0], np.cumsum([len(k) for k in keys])]).astype(np.int64)
    req_key = np.concatenate(keys).astype(np.int64) if keys else np.zeros(0, np.int64)
    acc = np.repeat(np.arange(len(keys)), np.diff(req_off))
    nxt = np.full(len(req_key), K.NEVER)
    order = np.lexsort((acc, req_key))
    same = req_key[order][1:] == req_key[order][:-1]
    nxt[order[:-1][same]] = acc[order][1:][same]
    steps = len(log) // L
    return Accesses(L=L, E=E, req_off=req_off, req_key=req_key,
                    req_tokens=np.concatenate(counts).astype(np.int64) if counts else np.zeros(0, np.int64),
                    req_next=nxt, step_ids=np.arange(steps), num_tokens=num_tokens)


def replay_feed(res: dict[str, Any]) -> dict[str, Any]:
    """What fc-evict got in a run_config result, as replay_slots keywords: each step's request and routing (its
    request profiles), the reuse probe's rows and the token table's forecasts the run computed, and the tokens
    routed to each expert of each access; {} for other policies. One request per step (batch size 1), as
    replay_slots' requests_S takes."""
    if not res.get("uses"):
        return {}
    if any(len(u.requests) != 1 for u in res["uses"]):
        raise ConfigError("replay_feed: a step batched several requests; replay_slots takes one request per step.")
    feed = {"requests_S": np.array([int(u.requests[0]) for u in res["uses"]], np.int64), "uses": res["uses"]}
    if res.get("reuse_steps"):
        feed["reuse"] = res["reuse_steps"]
    if any(res.get("next_uses") or ()):
        feed["next_use"] = res["next_uses"]
    if res.get("log"):  # the tokens routed to each expert of each access (accesses_from_log's order): a prefill's fold
        feed["req_count"] = np.concatenate([c for _, _, c in res["log"]]).astype(np.int64)
    return feed


def token_table_for(model_name: str, fit_trace: str | Path | None = None):
    """fc-evict's token table (predict/frequency.py ConditionalPredictor keyed by token id) for a run: fitted on
    `fit_trace` when given, else on the built-in model's standard trace (captured on first use), on its rows with a
    known document and token id; None for another model without --fit-trace (fc-evict then runs on the request
    profiles alone)."""
    from routecast.predict.frequency import ConditionalPredictor
    from routecast.trace.io import read_trace

    if fit_trace is None:
        from routecast.trace.standard import captured_name_of, standard_trace

        std = captured_name_of(model_name)
        if std is None:
            return None
        fit_trace = standard_trace(std)
    trace = read_trace(fit_trace, load_logits=False)
    rows = (np.asarray(trace.tokens["document"]) >= 0) & (np.asarray(trace.token_id) >= 0)
    if not rows.any():
        return None
    return ConditionalPredictor(trace.spec).fit_rows(trace, rows)


def run_config(model_dir: str | Path, requests: Sequence[tuple[list[int], int]], *, budget: int | None,
               prefetch: str = "none", predictor: Any = None, cfg_kw: dict[str, Any] | None = None,
               progress: bool = False, threads: int = 1, loaded: tuple[Any, Any] | None = None,
               batch_size: int = 1, preload: bool = False, switch_s: float = SWITCH_S,
               logits: bool = False, reuse_probe: Any = None, keep_feed: bool = False,
               token_table: Any = None) -> dict[str, Any]:
    """One configuration: budget None = all resident. -> figures + tokens + log. The model is loaded fresh unless
    `loaded` = (model, tokenizer) is given; then the run keeps its expert tensors aside and gives them back. A fresh
    offloaded model is loaded without its routed experts (load.py: they are read from the checkpoint into the slots).
    preload: fill the fast tier before the timed run (OffloadedModel.preload). switch_s: as generate_all.
    reuse_probe: a predict.reuse_probe.ReuseProbe that fc-evict reads (OffloadedModel). token_table: fc-evict's
    forecast of each step from its input tokens (token_table_for). keep_feed: with fc-evict
    the result also holds 'uses' (each step's StepUse), 'next_uses' (each step's token-table forecasts) and, with a
    probe, 'reuse_steps' (each step's rows (B, L, K)): what replay_feed hands replay_slots so that the replay decides
    as the run did."""
    from routecast.trace.capture_inputs import load_model

    torch.set_num_threads(threads)
    if loaded is not None:
        model, tok = loaded
        cfg_kw = {**(cfg_kw or {}), "keep_weights": True}
    else:
        model, tok = load_model(str(model_dir)) if budget is None else load_without_experts(model_dir)
    path = model_path(model_dir)
    if budget is None:
        res = generate_all(model, tok, requests, progress=progress, desc="all-resident", batch_size=batch_size,
                           logits=logits)
        res.update(config="all-resident", tokens_per_s=res["new_tokens"] / res["wall_s"], hit_ratio=1.0,
                   bytes_read=0, stall_s=0.0, stall_share=0.0)
        return res
    if predictor is not None:
        predictor.reset()  # a run starts from the fitted state (request ids restart at 1 in every run)
    off = OffloadedModel(model, path, OffloadConfig(budget=budget, **(cfg_kw or {})), predictor=predictor,
                         reuse_probe=reuse_probe, token_table=token_table)
    off.keep_feed = keep_feed
    try:
        if preload:
            off.preload()
        res = generate_all(model, tok, requests, offloaded=off, progress=progress, desc=f"offload {prefetch}",
                           batch_size=batch_size, switch_s=switch_s, logits=logits)
    finally:
        off.close()
    fig = off.figures()
    res.update(fig)
    res.update(config=prefetch, tokens_per_s=res["new_tokens"] / res["wall_s"], stall_share=fig["stall_s"] / res["wall_s"],
               reuse_probe=reuse_probe is not None, token_table=off.token_table is not None,
               next_uses=off.next_uses or None,
               log=off.log, pred_sets=np.array(off.pred_sets) if off.pred_sets else None, L=off.L, E=off.E,
               uses=off.uses or None, reuse_steps=[np.stack(r, 1) for r in off.reuse_rows] or None)
    return res


def offloaded_perplexity(model_name: str, texts: list[list[int]], *, budget: int, cfg_kw: dict[str, Any] | None = None,
                         predictor: Any = None, threads: int = 1) -> dict[str, Any]:
    """Teacher-forced perplexity over `texts` (token ids) with the experts offloaded (a fresh model; cfg_kw as
    OffloadConfig, e.g. fallback=True) -> {'perplexity', and the run's figures (hit ratio, rerouted share, ...)}."""
    from routecast.runtime.offload.fallback import perplexity

    torch.set_num_threads(threads)
    model, _tok = load_without_experts(model_name)
    path = model_path(model_name)
    if predictor is not None:
        predictor.reset()
    off = OffloadedModel(model, path, OffloadConfig(budget=budget, **(cfg_kw or {})), predictor=predictor)
    try:
        ppl = perplexity(model, texts, off)
    finally:
        off.close()
    return {"perplexity": ppl, **off.figures()}


def check_prefetch_top(top: int, top_k: int) -> None:
    """--prefetch-top keeps each token's `top` most likely experts of its top-k forecast: 0 (= top-k) to top_k."""
    if not 0 <= top <= top_k:
        raise ConfigError(f"--prefetch-top is {top}; expected 0 (the model's top-k) to {top_k} (its top-k).")


def generations(tok: Any, requests: list[tuple[list[int], int]], tokens: list[list[int]]) -> list[dict[str, Any]]:
    """One record per request: its prompt and generated text (decoded) and the generated token ids."""
    return [{"request": i + 1, "prompt": tok.decode(ids), "text": tok.decode(new), "token_ids": new}
            for i, ((ids, _), new) in enumerate(zip(requests, tokens, strict=True))]


def write_profile(model_name: str, out: str | Path, base: str | Path, *, direct: bool = True, reads: int = 64) -> dict[str, Any]:
    """Measure the model's disk tier (expert-sized O_DIRECT / fadvise reads) and write `base` with h2d_gbps set to
    it (name 'offload-cpu-disk') at `out`. -> the measurement."""
    from routecast.common.outputs import write_atomic
    from routecast.runtime.offload.engine import OffloadConfig, OffloadedModel
    from routecast.runtime.offload.load import load_without_experts, model_path
    from routecast.runtime.offload.tier import measure_bandwidth
    from routecast.sim.hardware import load_hardware
    hw = load_hardware(base)
    model, _ = load_without_experts(model_name)
    path = model_path(model_name)
    off = OffloadedModel(model, path, OffloadConfig(budget=1, direct=direct, verify=False))
    try:
        m = measure_bandwidth(off.tier, reads=reads)
    finally:
        off.close()
    prof = dataclasses.replace(hw, name="offload-cpu-disk", h2d_bandwidth=m["bandwidth_Bps"],
                               description=f"{hw.description}; slow tier: {model_name} experts on disk ({m['mode']})")
    note = (f"measured: {m['expert_bytes']} B expert / median {m['median_read_s'] * 1e6:.0f} us per {m['mode']} read "
            f"of {reads} random experts of {model_name} (routecast run --write-profile)")
    write_atomic(out, prof.to_toml({"interconnect.h2d_gbps": note}), "--write-profile")
    m["path"] = str(out)
    return m
