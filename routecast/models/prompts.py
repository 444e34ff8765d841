"""Capture prompts from the corpus: per-task lengths, Poisson arrivals, and a JSONL prompts file.

Each request draws its task from a mix (default: all tasks equally), a document of that task from
one corpus split (default ``test``, so prompts are text the model has not trained on), and a window
of ``prompt_tokens`` tokens at a random offset in that document. Lengths (in tokens of the given
tokenizer) are log-uniform between a task's bounds, so short requests are more common than long ones:

| task   | prompt tokens | new tokens | why                                               |
|--------|---------------|------------|---------------------------------------------------|
| code   | 96 - 192      | 16 - 64    | code context is long (a function and its imports) |
| docs   | 64 - 160      | 16 - 64    | a section of a reference page                     |
| austen | 32 - 128      | 32 - 96    | story continuation asks for longer outputs        |
| bible  | 16 - 64       | 16 - 48    | a verse or a few, answered with a few more        |
| wiki   | 48 - 128      | 16 - 64    | a paragraph, continued with a sentence or two     |

prompt + new tokens stays <= 256 (plus <|bos|>), the sequence length the built-in model was trained on.
Arrivals form a Poisson process of ``rate`` requests per second (exponential gaps, seeded); with
``rate=inf`` every request arrives at 0 s (offline batch).

Each record names its source document as ``task/doc_id``: several requests can be windows of one document,
and a held-out evaluation must keep them on one side (routecast.trace.Trace.split(by="document")).

A prompts file is JSONL, one request per line:
``{"prompt": str, "task": str, "max_new_tokens": int, "arrival_s": float, "document": str}`` (``task``
defaults to "unknown", ``max_new_tokens`` to 32, ``arrival_s`` to 0; arrivals must not decrease; ``document``
is optional: absent, the request's document is unknown).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from routecast.common.errors import ConfigError
from routecast.models.corpus import SPLITS, load_corpus


@dataclass(frozen=True, kw_only=True)
class LengthSpec:
    """Inclusive bounds in tokens of a task's prompt length and output length (log-uniform draws)."""

    prompt_min: int
    prompt_max: int
    new_min: int
    new_max: int

    def __post_init__(self) -> None:
        if not (1 <= self.prompt_min <= self.prompt_max and 1 <= self.new_min <= self.new_max):
            raise ConfigError(f"LengthSpec {self} is invalid; expected 1 <= min <= max for prompt and new tokens.")


DEFAULT_LENGTHS: Mapping[str, LengthSpec] = {
    "code": LengthSpec(prompt_min=96, prompt_max=192, new_min=16, new_max=64),
    "docs": LengthSpec(prompt_min=64, prompt_max=160, new_min=16, new_max=64),
    "austen": LengthSpec(prompt_min=32, prompt_max=128, new_min=32, new_max=96),
    "bible": LengthSpec(prompt_min=16, prompt_max=64, new_min=16, new_max=48),
    "wiki": LengthSpec(prompt_min=48, prompt_max=128, new_min=16, new_max=64),
}
_NEWLINE = "\u010a"  # byte-level BPE's printable stand-in for "\n"
FALLBACK_LENGTHS = LengthSpec(prompt_min=32, prompt_max=128, new_min=16, new_max=64)


@dataclass(frozen=True, kw_only=True)
class PromptConfig:
    """How many requests, how fast they arrive (requests/s), the task mix and lengths, the seed."""

    n_requests: int = 64
    rate: float = 2.0
    seed: int = 0
    split: str = "test"
    mix: Mapping[str, float] | None = None
    lengths: Mapping[str, LengthSpec] = field(default_factory=lambda: dict(DEFAULT_LENGTHS))

    def __post_init__(self) -> None:
        if self.n_requests < 1:
            raise ConfigError(f"n_requests {self.n_requests} must be at least 1.")
        if not self.rate > 0:
            raise ConfigError(f"rate {self.rate} requests/s must be positive (use inf for all at 0 s).")
        if self.split not in SPLITS:
            raise ConfigError(f"split '{self.split}' is not one of {list(SPLITS)}.")
        if self.mix is not None and (not self.mix or min(self.mix.values()) < 0 or sum(self.mix.values()) <= 0):
            raise ConfigError(f"mix {dict(self.mix)} must map tasks to non-negative weights with a positive sum.")


@dataclass(frozen=True, kw_only=True)
class PromptRecord:
    """One request: id, task, prompt (text and token ids), output budget (tokens), arrival time (s), and the
    document the prompt was cut from ("task/doc_id"; None = unknown)."""

    request: int
    task: str
    prompt_text: str
    prompt_ids: tuple[int, ...] | None
    max_new_tokens: int
    arrival_s: float
    document: str | None = None


def poisson_arrivals(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """float64[n] arrival times in seconds of a Poisson process with rate requests/s (0 s if rate=inf)."""
    if math.isinf(rate):
        return np.zeros(n)
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


def _log_uniform(rng: np.random.Generator, lo: int, hi: int) -> int:
    return int(min(hi, math.floor(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))


def build_prompts(tokenizer, config: PromptConfig = PromptConfig(), *, corpus_root: str | Path | None = None) -> list[PromptRecord]:
    """Sample config.n_requests prompts from a corpus split -> [PromptRecord] in arrival order.

    tokenizer: a Hugging Face tokenizer (fast); lengths are counted in its tokens and prompt_ids
    are its ids (without <|bos|>; add it when feeding the model).
    """
    docs = load_corpus(config.split, root=corpus_root)
    by_task: dict[str, list[str]] = {}
    doc_ids: dict[str, list[str]] = {}
    for d in docs:
        by_task.setdefault(d.task, []).append(d.text)
        doc_ids.setdefault(d.task, []).append(d.doc_id)
    mix = dict(config.mix) if config.mix is not None else {t: 1.0 for t in sorted(by_task)}
    missing = [t for t in mix if t not in by_task]
    if missing:
        raise ConfigError(f"mix names task(s) {missing} absent from the {config.split} split; expected some of {sorted(by_task)}.")
    tasks = sorted(mix)
    probs = np.array([mix[t] for t in tasks], dtype=float)
    rng = np.random.default_rng(config.seed)
    arrivals = poisson_arrivals(config.n_requests, config.rate, rng)
    task_idx = rng.choice(len(tasks), size=config.n_requests, p=probs / probs.sum())
    encode = tokenizer.backend_tokenizer.encode
    cache: dict[tuple[str, int], tuple[list[int], np.ndarray]] = {}
    out = []
    for r in range(config.n_requests):
        task = tasks[task_idx[r]]
        spec = config.lengths.get(task, FALLBACK_LENGTHS)
        want = _log_uniform(rng, spec.prompt_min, spec.prompt_max)
        new = _log_uniform(rng, spec.new_min, spec.new_max)
        d = int(rng.integers(len(by_task[task])))
        if (task, d) not in cache:
            enc = encode(by_task[task][d], add_special_tokens=False)
            # Prompts start at a line start (after a token ending in a newline), not mid-word.
            line_starts = [0] + [i + 1 for i, t in enumerate(enc.tokens[:-1]) if t.endswith(_NEWLINE)]
            cache[(task, d)] = (enc.ids, np.array(line_starts))
        ids, starts = cache[(task, d)]
        fits = starts[starts <= len(ids) - want]
        start = int(rng.choice(fits)) if len(fits) else 0
        window = tuple(ids[start : start + want])  # a document shorter than `want` gives all it has
        out.append(PromptRecord(request=r, task=task, prompt_text=tokenizer.decode(list(window)),
                                prompt_ids=window, max_new_tokens=new, arrival_s=float(arrivals[r]),
                                document=f"{task}/{doc_ids[task][d]}"))
    return out


def write_prompts(path: str | Path, records: Sequence[PromptRecord]) -> Path:
    """Write records as a JSONL prompts file (one {"prompt", "task", "max_new_tokens", "arrival_s"[, "document"]}
    per line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for rec in records:
            obj = {"request": rec.request, "prompt": rec.prompt_text, "task": rec.task,
                   "max_new_tokens": rec.max_new_tokens, "arrival_s": rec.arrival_s}
            if rec.document is not None:
                obj["document"] = rec.document
            fh.write(json.dumps(obj, ensure_ascii=False) + "\n")
    return path


def _field(obj: dict, key: str, kind: type | tuple[type, ...], default, where: str):
    value = obj.get(key, default)
    if value is None or isinstance(value, bool) or not isinstance(value, kind):
        expected = {str: "a string", int: "an integer"}.get(kind, "a number")
        raise ConfigError(f"{where}: field '{key}' is {value!r}; expected {expected}.")
    return value


def json_objects(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) of each non-blank line of a JSONL file; a line that is not UTF-8 JSON holding an
    object raises ConfigError naming the file and the line."""
    try:
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{path} line {lineno}: not valid JSON ({exc.msg} at column {exc.colno}); "
                                      "expected one object per line.") from None
                if not isinstance(obj, dict):
                    raise ConfigError(f"{path} line {lineno}: got {type(obj).__name__}; expected a JSON object with "
                                      "a 'prompt' field.")
                yield lineno, obj
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: byte {exc.start} is not UTF-8 text; expected a JSONL prompts file.") from None


def read_prompts(path: str | Path) -> list[PromptRecord]:
    """Read a JSONL prompts file -> [PromptRecord]; a bad line raises ConfigError naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"prompts file {path} does not exist; expected JSONL with one request per line.")
    out: list[PromptRecord] = []
    last_arrival, last_line = 0.0, 0
    seen: dict[int, int] = {}
    for lineno, obj in json_objects(path):
        where = f"{path} line {lineno}"
        if "prompt" not in obj:
            raise ConfigError(f"{where}: the 'prompt' field is missing; expected a string.")
        prompt = _field(obj, "prompt", str, None, where)
        task = _field(obj, "task", str, "unknown", where)
        new = _field(obj, "max_new_tokens", int, 32, where)
        arrival = float(_field(obj, "arrival_s", (int, float), 0.0, where))
        if new < 1:
            raise ConfigError(f"{where}: max_new_tokens is {new}; expected a positive integer.")
        if not math.isfinite(arrival) or arrival < 0:
            raise ConfigError(f"{where}: arrival_s is {arrival}; expected a finite number >= 0 seconds.")
        if arrival < last_arrival:
            raise ConfigError(f"{where}: arrival_s {arrival} is earlier than line {last_line}'s {last_arrival}; "
                              "expected arrivals in non-decreasing order.")
        request = obj.get("request", len(out))
        if not isinstance(request, int) or isinstance(request, bool):
            raise ConfigError(f"{where}: field 'request' is {request!r}; expected an integer.")
        if request in seen:
            raise ConfigError(f"{where}: request id {request} repeats line {seen[request]}; expected unique ids.")
        seen[request] = lineno
        document = obj.get("document")
        if document is not None and not isinstance(document, str):
            raise ConfigError(f"{where}: field 'document' is {document!r}; expected a string naming the "
                              "prompt's source document.")
        out.append(PromptRecord(request=request, task=task, prompt_text=prompt, prompt_ids=None,
                                max_new_tokens=new, arrival_s=arrival, document=document))
        last_arrival, last_line = arrival, lineno
    if not out:
        raise ConfigError(f"prompts file {path} holds no requests; expected at least one JSON line.")
    return out
