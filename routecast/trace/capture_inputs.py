"""Inputs of `routecast capture`, checked before any work: prompts, the model folder, the resume record.

Prompts come from a JSONL file, `corpus:NAME[:N]` or a sequence of dicts (validated into request
records). Model folders are read from safetensors only (never a pickle: pytorch_model.bin is refused
before transformers could torch.load it) and with trust_remote_code=False, so a config's `auto_map`
custom code never runs. A capture resumes only with the arguments it was started with (stored in the
trace's provenance); different arguments are refused, since the resumed trace would mix two prompt sets.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from torch import nn

from routecast.common.errors import ConfigError, RoutecastError
from routecast.trace.capture_arch import adapter_for

# Provenance fields a resumed capture must match: a different value means a different trace.
RESUME_KEYS = ("model", "prompts", "max_new_tokens", "hidden", "logits", "prompts_sha256")


def _int(v: Any, where: str, lo: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ConfigError(f"{where} is {v!r}; expected an integer >= {lo}.")
    return int(v)


def _records(prompts: Sequence[Any], max_new_tokens: int, where: str) -> list[dict[str, Any]]:
    """Validated request records: request, prompt, task, source, max_new_tokens, arrival_s, document."""
    out = []
    for i, r in enumerate(prompts):
        if isinstance(r, str):
            r = {"prompt": r}
        if not isinstance(r, Mapping):
            raise ConfigError(f"{where}: record {i} is a {type(r).__name__}; expected an object with a 'prompt' string.")
        text = r.get("prompt")
        if not isinstance(text, str) or not text:
            raise ConfigError(f"{where}: record {i} has prompt {text!r}; expected a non-empty string.")
        arrival = r.get("arrival_s", 0.0)
        if isinstance(arrival, bool) or not isinstance(arrival, (int, float)) or not math.isfinite(arrival):
            raise ConfigError(f"{where}: record {i} has arrival_s {arrival!r}; expected a finite number of seconds.")
        for key in ("task", "source"):
            if r.get(key) is not None and not isinstance(r[key], str):
                raise ConfigError(f"{where}: record {i} has {key} {r[key]!r}; expected a string.")
        doc = r.get("document")
        if doc is not None and not isinstance(doc, str) and (isinstance(doc, bool) or not isinstance(doc, int) or doc < 0):
            raise ConfigError(f"{where}: record {i} has document {doc!r}; expected a string or an integer >= 0 "
                              "naming the prompt's source document.")
        out.append({
            "request": _int(r.get("request", i), f"{where}: record {i} field 'request'"),
            "prompt": text,
            "task": r.get("task"),
            "source": r.get("source"),
            "max_new_tokens": _int(r.get("max_new_tokens", max_new_tokens), f"{where}: record {i} field 'max_new_tokens'"),
            "arrival_s": float(arrival),
            "document": doc,
        })
    ids = [r["request"] for r in out]
    if len(set(ids)) != len(ids):
        dup = next(x for x in ids if ids.count(x) > 1)
        raise ConfigError(f"{where}: request id {dup} appears more than once; expected unique request ids.")
    return out


def document_ids(records: Sequence[Mapping[str, Any]], where: str = "prompts") -> tuple[list[int], tuple[str, ...]]:
    """Each record's 'document' as an int64 id (-1 = none given) -> (ids, names).

    String documents are numbered by their sorted order (names[i] is document i), so the same prompts give the
    same ids on a resumed run; integer documents are kept as they are (names empty). Mixing the two is refused.
    """
    docs = [r.get("document") for r in records]
    strs = sorted({d for d in docs if isinstance(d, str)})
    if strs and any(d is not None and not isinstance(d, str) for d in docs):
        raise ConfigError(f"{where}: documents mix strings and integers; expected one kind for every record.")
    index = {n: i for i, n in enumerate(strs)}
    return [-1 if d is None else index[d] if isinstance(d, str) else int(d) for d in docs], tuple(strs)


def corpus_config(name: str) -> dict[str, Any]:
    """corpus:SPLIT[:N] or corpus:TASK[:N] (name without 'corpus:') -> PromptConfig keywords, checked (the
    count too) without loading anything, so a bad spec is refused before the model loads."""
    from routecast.models.corpus import SPLITS, TASKS  # the corpus package; imported only when asked

    what, _, n = name.partition(":")
    if not n.isdigit() and n:
        raise ConfigError(f"--prompts: corpus:{name} has count {n!r}; expected corpus:SPLIT[:N] or corpus:TASK[:N].")
    kw: dict[str, Any] = {"n_requests": int(n)} if n else {}
    if what in SPLITS:
        kw["split"] = what
    elif what in TASKS:
        kw["mix"] = {what: 1.0}
    else:
        raise ConfigError(f"--prompts: corpus:{name} names neither a split {list(SPLITS)} nor a task {list(TASKS)}; "
                          "expected corpus:SPLIT[:N] or corpus:TASK[:N].")
    if n:
        _check_corpus_count(name, int(n), kw.get("split", "test"), list(kw["mix"]) if "mix" in kw else None)
    return kw


def _corpus_prompts(name: str, tokenizer: Any) -> list[dict[str, Any]]:
    """corpus:SPLIT[:N] or corpus:TASK[:N] -> N records sampled by routecast.models.prompts (default N 64)."""
    from routecast.models.prompts import PromptConfig, build_prompts

    kw = corpus_config(name)
    if tokenizer is None:
        raise ConfigError(f"--prompts: corpus:{name} needs the model's tokenizer to size prompts; expected one.")
    return [{"request": r.request, "prompt": r.prompt_text, "task": r.task, "max_new_tokens": r.max_new_tokens,
             "arrival_s": r.arrival_s, "document": r.document} for r in build_prompts(tokenizer, PromptConfig(**kw))]


def _check_corpus_count(name: str, n: int, split: str, tasks: list[str] | None) -> None:
    """Refuse more requests than the split holds disjoint prompt windows (every token is >= 1 byte, so a
    window of prompt_min tokens spans >= prompt_min bytes): beyond that, prompts only repeat."""
    from routecast.models.corpus import read_manifest
    from routecast.models.prompts import DEFAULT_LENGTHS, FALLBACK_LENGTHS

    if n < 1:
        raise ConfigError(f"--prompts: corpus:{name} asks for {n} requests; expected at least 1.")
    entries = read_manifest()["tasks"]
    cap = sum(int(e["splits"][split]["bytes"]) // DEFAULT_LENGTHS.get(t, FALLBACK_LENGTHS).prompt_min
              for t, e in entries.items() if tasks is None or t in tasks)
    if n > cap:
        raise ConfigError(f"--prompts: corpus:{name} asks for {n} requests, more than the {cap} disjoint prompt "
                          f"windows the shipped {split} split holds; expected N <= {cap} (use a JSONL prompts file "
                          "for more).")


def load_prompts(source: str | Path | Sequence[Mapping[str, Any]], tokenizer: Any = None) -> list[dict[str, Any]]:
    """Prompt records from a JSONL file, 'corpus:NAME[:N]' or a sequence of dicts.

    JSONL: one object per line, {"prompt": str, "task": str?, "max_new_tokens": int?, "arrival_s": float?,
    "request": int?, "document": str or int?}; blank lines are skipped. corpus:NAME samples N prompts (default 64) from the
    built-in corpus with routecast.models.prompts: NAME is a split (train, val, test: all tasks) or a
    task (code, docs, austen, bible, wiki: test split); lengths are counted in tokenizer's tokens.
    """
    if isinstance(source, str) and source.startswith("corpus:"):
        return _corpus_prompts(source[len("corpus:"):], tokenizer)
    if not isinstance(source, (str, Path)):
        return [dict(r) if isinstance(r, Mapping) else r for r in source]
    path = Path(source)
    if not path.is_file():
        raise ConfigError(f"--prompts: {str(path)!r} is not a file; expected a JSONL file or corpus:NAME.")
    from routecast.models.prompts import json_objects

    records = [rec for _, rec in json_objects(path)]
    if not records:
        raise ConfigError(f"{path}: holds no prompt records; expected at least one JSON line with 'prompt'.")
    _records(records, 0, str(path))  # validate now so a bad line is reported with the file name
    return records


def check_model_dir(path: Path, flag: str = "--model") -> None:
    """Refuse a model folder routecast would not load safely or at all, with one sentence, before transformers
    sees it: no config.json or one that is not a JSON object, no *.safetensors weights (a pytorch_model.bin
    alone would need torch.load, which can run pickled code), or a safetensors file that is truncated.
    """
    from routecast.trace.shards import _read_header

    if not path.is_dir():
        raise ConfigError(f"{flag} {path}: not a directory; expected a Hugging Face model directory or 'builtin'.")
    cfg = path / "config.json"
    if not cfg.is_file():
        raise ConfigError(f"{flag} {path} has no config.json; expected a Hugging Face model directory or 'builtin'.")
    try:
        doc = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{flag} {cfg}: is not valid JSON ({str(e)[:80]}); expected a model config object.") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model_type", ""), str):
        raise ConfigError(f"{flag} {cfg}: holds {type(doc).__name__} without a string 'model_type'; expected a "
                          "Hugging Face model config object.")
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        what = f"only pickle weights ({', '.join(pickles[:3])})" if pickles else "no *.safetensors weights"
        raise ConfigError(f"{flag} {path} holds {what}; expected *.safetensors (routecast never unpickles "
                          "weights; convert them with safetensors first).")
    for w in weights:
        try:
            _read_header(w)
        except RoutecastError as e:
            why = str(e).split(": ", 1)[-1].rstrip(".")
            raise ConfigError(f"{flag} {path}: weight file {w.name} is damaged ({why}).") from None


def load_model(model_dir_or_builtin: str | Path, *, device: str = "cpu") -> tuple[nn.Module, Any]:
    """(model in eval mode on device, tokenizer) from a Hugging Face model directory, 'builtin' or 'builtin-fine'.

    Weights come from safetensors only; trust_remote_code stays False, so custom code (auto_map) never runs.
    """
    name = str(model_dir_or_builtin)
    if name.lower() in ("builtin", "builtin-fine"):
        from routecast.models.builtin import check_checkpoint  # imported only when asked

        path = Path(check_checkpoint(name))
    else:
        path = Path(name)
    check_model_dir(path)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    try:
        cfg = AutoConfig.from_pretrained(path, trust_remote_code=False, local_files_only=True)
        adapter_for(SimpleNamespace(config=cfg))  # a dense or unsupported model is refused before its weights load
        cls = AutoModelForSeq2SeqLM if getattr(cfg, "is_encoder_decoder", False) else AutoModelForCausalLM
        model = cls.from_pretrained(path, config=cfg, trust_remote_code=False, use_safetensors=True,
                                    local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    except RoutecastError:
        raise
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, ImportError) as e:
        # transformers' own refusals (unknown model_type, missing tokenizer, shapes that do not match the config)
        msg = " ".join(str(e).split())[:160]
        raise ConfigError(f"--model {name}: transformers cannot load it ({type(e).__name__}: {msg}); expected a "
                          "Hugging Face MoE model directory with config, safetensors weights and a tokenizer.") from None
    return model.eval().to(device), tokenizer


def prompts_digest(records: Sequence[Mapping[str, Any]]) -> str:
    """sha256 of the request records (ids, prompts, budgets, tasks): what 'the same prompts' means on resume."""
    keys = ("request", "prompt", "task", "source", "max_new_tokens", "document")
    doc = [{k: r.get(k) for k in keys} for r in records]
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def check_resume(out: str | Path, provenance: Mapping[str, Any]) -> None:
    """Refuse to resume a capture at out that was started with other arguments (RESUME_KEYS)."""
    from routecast.trace.shards import TRACE_JSON, WRITER_JSON

    p = Path(out)
    for d in (p.with_name(f".{p.name}.partial"), p):
        rec = next((d / n for n in (WRITER_JSON, TRACE_JSON) if (d / n).is_file()), None)
        if rec is None:
            continue
        try:
            have = json.loads(rec.read_text()).get("provenance") or {}
        except (OSError, ValueError, AttributeError):
            raise ConfigError(f"--out {p}: {rec} cannot be read as JSON; expected the record of the capture "
                              "to resume (pass --overwrite to start again).") from None
        if have.get("tool") != "routecast.trace.capture":
            raise ConfigError(f"--out {p} holds a trace made by {have.get('tool') or have.get('importer') or 'another tool'}"
                              f" ({rec.name}); expected a capture to resume (pass --overwrite to replace it).")
        for k in RESUME_KEYS:
            if have.get(k) != provenance.get(k) and k == "prompts_sha256":
                raise ConfigError(f"--out {p} was captured from prompts whose content differs from --prompts "
                                  f"{provenance.get('prompts')} now (sha256 {str(have.get(k))[:12]}... vs "
                                  f"{str(provenance.get(k))[:12]}...); expected the same prompts to resume (pass "
                                  "--overwrite to start again, or choose another --out).")
            if have.get(k) != provenance.get(k):
                flag = {"model": "--model"}.get(k, f"--{k.replace('_', '-')}")
                raise ConfigError(f"--out {p} was captured with {flag} {have.get(k)!r}, not {provenance.get(k)!r}; "
                                  "expected the same arguments to resume (pass --overwrite to start again, or "
                                  "choose another --out).")
        return
