"""The multi-domain text corpus: five tasks, split by document into train/val/test.

Tasks (see ``sources.py`` for the readers and ``TASK_INFO`` for sources and licences):
``code`` (CPython standard library), ``docs`` (Python documentation sources), ``austen`` (Jane
Austen's six novels, by chapter), ``bible`` (King James Version, by book), ``wiki`` (English
Wikipedia articles from the shortened dump in gensim's test data).

Splits: per task, documents are shuffled with a fixed seed, then test and val take whole documents
until each holds ``split_fraction`` (10%) of the task's bytes; the rest is train. A document is
never cut, so no text appears in two splits.

On disk (a corpus directory): ``manifest.json`` plus one ``{task}.{split}.jsonl.gz`` per task and
split, one JSON object ``{"doc_id": str, "text": str}`` per line; gzip headers carry no time stamp,
so rebuilding gives byte-identical files.

The package ships a compact sample in ``routecast/models/data/`` (whole documents drawn from each
split of the full corpus, so a sample val document is a full-corpus val document too); tests and the
demo read only that. The full corpus is rebuilt from Debian packages and one PyPI wheel with
``scripts/build_corpus.sh`` (needs root for apt-get and network access), which runs::

    apt-get install -y python3.11-doc r-cran-janeaustenr bible-kjv-text
    pip download --no-deps gensim==4.4.0 -d /tmp/gensim-wheel
    python -m routecast.models.corpus build --out corpus_build \\
        --gensim-wheel /tmp/gensim-wheel/gensim-4.4.0-*.whl --sample-out routecast/models/data

Loader: ``load_corpus(split="train", tasks=None, root=None) -> list[Document]``.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from routecast.common import numbers as N
from routecast.common.errors import ConfigError
from routecast.models import sources

TASKS = ("code", "docs", "austen", "bible", "wiki")
SPLITS = ("train", "val", "test")
SAMPLE_DIR = Path(__file__).resolve().parent / "data"
MANIFEST = "manifest.json"
SCHEMA_VERSION = 1

TASK_INFO = {
    "code": {
        "source": "CPython 3.11 standard library (/usr/lib/python3.11, Debian package libpython3.11-stdlib)",
        "license": "PSF-2.0 (Python Software Foundation License)",
        "unit": "source file",
    },
    "docs": {
        "source": "Python 3.11 documentation reStructuredText sources (Debian package python3.11-doc, html/_sources)",
        "license": "PSF-2.0 (Python Software Foundation License); documentation examples under 0BSD",
        "unit": "documentation page",
    },
    "austen": {
        "source": "Jane Austen's six novels (Debian package r-cran-janeaustenr 1.0.0, R lazy-load data)",
        "license": "public domain text; the R package janeaustenr is MIT-licensed (Julia Silge)",
        "unit": "chapter",
    },
    "bible": {
        "source": "King James Version of the Bible (Debian package bible-kjv-text 4.38, /usr/lib/bible.data)",
        "license": "public domain",
        "unit": "book",
    },
    "wiki": {
        "source": "English Wikipedia articles from the shortened dump in the gensim 4.4.0 wheel "
                  f"({sources.WIKI_MEMBER}); markup stripped",
        "license": "Wikipedia text is CC BY-SA (3.0/4.0, attribution: Wikipedia contributors); the gensim "
                   "wheel that carries the dump is LGPL-2.1-only and has no separate notice for it",
        "unit": "article",
    },
}


@dataclass(frozen=True, kw_only=True)
class Document:
    """One corpus document: its task, an id unique within the task, and its text (str)."""

    task: str
    doc_id: str
    text: str


@dataclass(frozen=True, kw_only=True)
class CorpusSources:
    """Where the raw sources live on this machine (defaults: Debian 12 package paths)."""

    code_dir: str = "/usr/lib/python3.11"
    docs_dir: str = "/usr/share/doc/python3.11/html/_sources"
    austen_dir: str = "/usr/lib/R/site-library/janeaustenr/data"
    bible_file: str = "/usr/lib/bible.data"
    gensim_wheel: str = ""


@dataclass(frozen=True, kw_only=True)
class SampleCaps:
    """Bytes of whole documents per task kept in the shipped sample, per split."""

    train: int = 500_000
    val: int = 120_000
    test: int = 120_000


def read_sources(src: CorpusSources, tasks: Sequence[str] = TASKS) -> dict[str, list[Document]]:
    """Run the reader of each task -> {task: [Document]} in the readers' (sorted) order."""
    if "wiki" in tasks and not src.gensim_wheel:
        raise ConfigError("--gensim-wheel is empty; expected the path of a downloaded gensim 4.4.0 wheel.")
    readers = {
        "code": lambda: sources.read_code(src.code_dir),
        "docs": lambda: sources.read_docs(src.docs_dir),
        "austen": lambda: sources.read_austen(src.austen_dir),
        "bible": lambda: sources.read_bible(src.bible_file),
        "wiki": lambda: sources.read_wiki(src.gensim_wheel),
    }
    return {t: [Document(task=t, doc_id=i, text=x) for i, x in readers[t]()] for t in tasks}


def _task_seed(seed: int, task: str) -> int:
    return seed * 1_000_003 + zlib.crc32(task.encode())


def split_documents(docs: list[Document], *, seed: int = 0, fraction: float = 0.1) -> dict[str, list[Document]]:
    """Shuffle docs with a fixed seed; test, then val take whole docs up to fraction of bytes each."""
    if len(docs) < 3:
        raise ConfigError(f"task '{docs[0].task if docs else '?'}' has {len(docs)} documents; expected at least 3.")
    order = np.random.default_rng(_task_seed(seed, docs[0].task)).permutation(len(docs))
    shuffled = [docs[i] for i in order]
    sizes = np.array([len(d.text.encode()) for d in shuffled])
    target = fraction * sizes.sum()
    out: dict[str, list[Document]] = {"test": [], "val": [], "train": []}
    i = 0
    for split in ("test", "val"):
        got = 0
        # Stop before train would be left empty; at least one document per split.
        while i < len(shuffled) - 1 and (got < target or not out[split]):
            out[split].append(shuffled[i])
            got += sizes[i]
            i += 1
    out["train"] = shuffled[i:]
    return {s: out[s] for s in SPLITS}


def sample_documents(docs: list[Document], cap: int) -> list[Document]:
    """Whole documents, in the given order, whose total UTF-8 size stays <= cap (at least one)."""
    picked, total = [], 0
    for d in docs:
        n = len(d.text.encode())
        if total + n <= cap:
            picked.append(d)
            total += n
    return picked or [min(docs, key=lambda d: len(d.text))]


def _write_jsonl_gz(path: Path, docs: list[Document]) -> None:
    buf = io.BytesIO()
    # mtime=0 and no file name in the header: rebuilding gives byte-identical files.
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        for d in docs:
            gz.write((json.dumps({"doc_id": d.doc_id, "text": d.text}, ensure_ascii=False) + "\n").encode())
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, path)


def write_corpus(root: str | Path, splits: dict[str, dict[str, list[Document]]], *, kind: str, seed: int,
                 extra: dict | None = None) -> Path:
    """Write {task: {split: docs}} as jsonl.gz files plus manifest.json under root -> root."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tasks = {}
    for task, by_split in splits.items():
        entry = dict(TASK_INFO[task])
        entry["splits"] = {}
        for split in SPLITS:
            docs = by_split[split]
            name = f"{task}.{split}.jsonl.gz"
            _write_jsonl_gz(root / name, docs)
            entry["splits"][split] = {
                "file": name,
                "docs": len(docs),
                "bytes": sum(len(d.text.encode()) for d in docs),
                "file_bytes": (root / name).stat().st_size,
                "sha256": hashlib.sha256((root / name).read_bytes()).hexdigest(),
            }
        tasks[task] = entry
    manifest = {"schema_version": SCHEMA_VERSION, "kind": kind, "seed": seed, "split_fraction": 0.1,
                "tasks": tasks, **(extra or {})}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return root


def build_corpus(out_dir: str | Path, *, src: CorpusSources, seed: int = 0, sample_dir: str | Path | None = None,
                 caps: SampleCaps = SampleCaps(), tasks: Sequence[str] = TASKS) -> Path:
    """Read all sources, split, write the full corpus to out_dir and (optionally) the sample -> out_dir."""
    bad = [t for t in tasks if t not in TASKS]
    if bad:
        raise ConfigError(f"--tasks has unknown task(s) {bad}; expected a subset of {list(TASKS)}.")
    docs = read_sources(src, tasks)
    splits = {t: split_documents(docs[t], seed=seed) for t in tasks}
    write_corpus(out_dir, splits, kind="full", seed=seed)
    if sample_dir is not None:
        capped = {t: {s: sample_documents(splits[t][s], getattr(caps, s)) for s in SPLITS} for t in tasks}
        full_counts = {t: {s: {"docs": len(v), "bytes": sum(len(d.text.encode()) for d in v)}
                           for s, v in splits[t].items()} for t in tasks}
        write_corpus(sample_dir, capped, kind="sample", seed=seed,
                     extra={"sample_caps_bytes": {s: getattr(caps, s) for s in SPLITS},
                            "full_corpus": full_counts,
                            "rebuild": "scripts/build_corpus.sh (see routecast/models/corpus.py docstring)"})
    return Path(out_dir)


def read_manifest(root: str | Path | None = None) -> dict:
    """manifest.json of a corpus directory (default: the shipped sample) -> dict."""
    root = Path(root) if root is not None else SAMPLE_DIR
    path = root / MANIFEST
    if not path.is_file():
        raise ConfigError(f"corpus manifest {path} not found; expected a directory written by `routecast corpus build`.")
    manifest = json.loads(path.read_text())
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise ConfigError(f"{path}: schema_version {manifest.get('schema_version')!r} is not {SCHEMA_VERSION}.")
    return manifest


def load_corpus(split: str = "train", tasks: Sequence[str] | None = None,
                root: str | Path | None = None) -> list[Document]:
    """Documents of one split for the given tasks (default all), from root (default: shipped sample)."""
    if split not in SPLITS:
        raise ConfigError(f"split '{split}' is not one of {list(SPLITS)}.")
    root = Path(root) if root is not None else SAMPLE_DIR
    manifest = read_manifest(root)
    tasks = list(manifest["tasks"]) if tasks is None else list(tasks)
    out = []
    for task in tasks:
        if task not in manifest["tasks"]:
            raise ConfigError(f"task '{task}' is not in {root / MANIFEST}; expected one of {list(manifest['tasks'])}.")
        path = root / manifest["tasks"][task]["splits"][split]["file"]
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                try:
                    rec = json.loads(line)
                    out.append(Document(task=task, doc_id=rec["doc_id"], text=rec["text"]))
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    raise ConfigError(f"{path}:{lineno}: not a {{'doc_id', 'text'}} JSON object ({exc}).") from exc
    return out


def build_parser() -> argparse.ArgumentParser:
    """The parser of `routecast corpus`."""
    p = N.Parser(prog="routecast corpus", description="Build the multi-domain text corpus.")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="read the raw sources, split them, write the corpus (and the sample)")
    d = CorpusSources()
    b.add_argument("--out", required=True, help="output directory for the full corpus")
    b.add_argument("--gensim-wheel", required=True, help="path of the gensim 4.4.0 wheel (pip download --no-deps)")
    b.add_argument("--sample-out", default=None, help="also write the compact sample here (e.g. routecast/models/data)")
    b.add_argument("--seed", type=N.seed(), default=0, help="seed of the document split (default 0)")
    b.add_argument("--code-dir", default=d.code_dir, help=f"CPython standard library (default {d.code_dir})")
    b.add_argument("--docs-dir", default=d.docs_dir, help=f"Python docs _sources (default {d.docs_dir})")
    b.add_argument("--austen-dir", default=d.austen_dir, help=f"janeaustenr data folder (default {d.austen_dir})")
    b.add_argument("--bible-file", default=d.bible_file, help=f"bible-kjv-text data file (default {d.bible_file})")
    b.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty --out / --sample-out, replacing the corpus files there")
    return N.annotate_help(p)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m routecast.models.corpus build --out DIR --gensim-wheel WHL [...]` -> exit code."""
    try:
        args = build_parser().parse_args(argv)
    except N.UsageError as e:
        print(f"{e.prog}: error: {e}", file=sys.stderr)
        return 2
    from routecast.common.outputs import check_out_dir, declare_inputs

    declare_inputs(args, ("--code-dir", "--docs-dir", "--austen-dir", "--bible-file", "--gensim-wheel"))
    try:
        for flag, d in (("--out", args.out), ("--sample-out", args.sample_out)):
            if d is not None:
                check_out_dir(d, flag, overwrite=args.overwrite)
    except ConfigError as exc:
        print(f"routecast corpus: error: {exc}", file=sys.stderr)
        return 2
    src = CorpusSources(code_dir=args.code_dir, docs_dir=args.docs_dir, austen_dir=args.austen_dir,
                        bible_file=args.bible_file, gensim_wheel=args.gensim_wheel)
    try:
        out = build_corpus(args.out, src=src, seed=args.seed, sample_dir=args.sample_out)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for task, entry in read_manifest(out)["tasks"].items():
        counts = ", ".join(f"{s} {v['docs']} docs {v['bytes'] / 1e6:.2f} MB" for s, v in entry["splits"].items())
        print(f"{task:7s} {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
