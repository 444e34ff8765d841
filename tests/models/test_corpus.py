"""The shipped corpus sample: manifest integrity, split hygiene, loaders, and the source readers."""

from __future__ import annotations

import gzip
import hashlib
import struct
from pathlib import Path

import pytest

from routecast.common.errors import ConfigError
from routecast.models.corpus import (
    SAMPLE_DIR,
    SPLITS,
    TASKS,
    Document,
    load_corpus,
    read_manifest,
    sample_documents,
    split_documents,
    write_corpus,
)
from routecast.models.rdata import RObject, read_lazyload, unserialize
from routecast.models.sources import read_austen, read_bible, strip_wiki_markup, unlzw
from tests.models import corpus_fixture as fx


@pytest.fixture(scope="module")
def manifest():
    return read_manifest()


@pytest.fixture(scope="module")
def docs_by_split():
    return {s: load_corpus(s) for s in SPLITS}


def test_manifest_lists_every_task_and_split(manifest):
    assert manifest["kind"] == "sample"
    assert set(manifest["tasks"]) == set(TASKS)
    for task, entry in manifest["tasks"].items():
        assert entry["source"] and entry["license"], task
        assert set(entry["splits"]) == set(SPLITS)
        for split, info in entry["splits"].items():
            assert info["docs"] >= 1, (task, split)
            # The sample is drawn from the full corpus' split, so it can never be bigger.
            assert info["docs"] <= manifest["full_corpus"][task][split]["docs"]


def test_licences_recorded(manifest):
    wiki = manifest["tasks"]["wiki"]["license"]
    assert "CC BY-SA" in wiki and "LGPL-2.1" in wiki
    assert "PSF" in manifest["tasks"]["code"]["license"] and "PSF" in manifest["tasks"]["docs"]["license"]
    assert "public domain" in manifest["tasks"]["bible"]["license"]
    assert "public domain" in manifest["tasks"]["austen"]["license"]


def test_counts_and_checksums_match_files(manifest, docs_by_split):
    total = 0
    for task, entry in manifest["tasks"].items():
        for split, info in entry["splits"].items():
            path = SAMPLE_DIR / info["file"]
            raw = path.read_bytes()
            total += len(raw)
            assert hashlib.sha256(raw).hexdigest() == info["sha256"], path
            assert len(raw) == info["file_bytes"]
            docs = [d for d in docs_by_split[split] if d.task == task]
            assert len(docs) == info["docs"], (task, split)
            assert sum(len(d.text.encode()) for d in docs) == info["bytes"], (task, split)
    assert total < 5_000_000  # a compact sample: a few MB at most


def test_no_document_in_two_splits(docs_by_split):
    seen: dict[tuple[str, str], str] = {}
    texts: dict[str, str] = {}
    for split, docs in docs_by_split.items():
        for d in docs:
            assert (d.task, d.doc_id) not in seen, f"{d.task}/{d.doc_id} in {seen.get((d.task, d.doc_id))} and {split}"
            seen[(d.task, d.doc_id)] = split
            h = hashlib.sha1(d.text.encode()).hexdigest()
            assert texts.setdefault(h, split) == split, f"identical text in two splits: {d.doc_id}"


def test_load_corpus_filters_tasks_and_rejects_bad_args():
    docs = load_corpus("val", tasks=["bible"])
    assert docs and {d.task for d in docs} == {"bible"}
    with pytest.raises(ConfigError, match="split 'dev'"):
        load_corpus("dev")
    with pytest.raises(ConfigError, match="task 'poetry'"):
        load_corpus("train", tasks=["poetry"])
    with pytest.raises(ConfigError, match="manifest"):
        load_corpus("train", root=Path("/nonexistent/corpus"))


def _docs(n: int, task: str = "t") -> list[Document]:
    return [Document(task=task, doc_id=f"d{i}", text="x" * (100 + 37 * i)) for i in range(n)]


def test_split_is_a_seeded_partition():
    docs = _docs(50)
    a, b = split_documents(docs, seed=0), split_documents(docs, seed=0)
    assert {s: [d.doc_id for d in v] for s, v in a.items()} == {s: [d.doc_id for d in v] for s, v in b.items()}
    ids = [d.doc_id for s in SPLITS for d in a[s]]
    assert sorted(ids) == sorted(d.doc_id for d in docs) and len(set(ids)) == len(ids)
    assert all(a[s] for s in SPLITS)
    c = split_documents(docs, seed=1)
    assert [d.doc_id for d in c["test"]] != [d.doc_id for d in a["test"]]
    with pytest.raises(ConfigError, match="at least 3"):
        split_documents(_docs(2))


def test_sample_respects_cap():
    docs = _docs(20)
    picked = sample_documents(docs, 1000)
    assert sum(len(d.text) for d in picked) <= 1000 and picked
    assert sample_documents(docs, 1) == [docs[0]]  # nothing fits: the smallest document alone


def test_write_corpus_round_trip_is_deterministic(tmp_path):
    splits = {"code": split_documents(_docs(10, "code"), seed=3)}
    write_corpus(tmp_path / "a", splits, kind="full", seed=3)
    write_corpus(tmp_path / "b", splits, kind="full", seed=3)
    for s in SPLITS:
        assert (tmp_path / "a" / f"code.{s}.jsonl.gz").read_bytes() == (tmp_path / "b" / f"code.{s}.jsonl.gz").read_bytes()
    back = load_corpus("train", root=tmp_path / "a")
    assert back == splits["code"]["train"]


def test_bad_line_in_corpus_file_is_named(tmp_path):
    write_corpus(tmp_path, {"code": split_documents(_docs(5, "code"))}, kind="full", seed=0)
    with gzip.open(tmp_path / "code.val.jsonl.gz", "wt") as fh:
        fh.write('{"doc_id": "a", "text": "ok"}\n{"doc_id": 1\n')
    with pytest.raises(ConfigError, match=r"code\.val\.jsonl\.gz:2"):
        load_corpus("val", root=tmp_path)


def test_strip_wiki_markup():
    src = ("'''Anarchism''' is a [[political philosophy|philosophy]]{{sfn|Smith|2001}} of [[liberty]]."
           "<ref name=a>Ref text</ref>\n[[File:A.jpg|thumb|A [[caption]]]]\n== History ==\n"
           "{| class=wikitable\n| cell\n|}\nSee [http://example.org the site] &amp; more.")
    out = strip_wiki_markup(src)
    assert out.startswith("Anarchism is a philosophy of liberty.")
    assert "History" in out and "the site & more" in out
    for junk in ("[[", "{{", "<ref", "File:", "cell", "'''"):
        assert junk not in out


def _xdr_strings(values: list[str]) -> bytes:
    """An R XDR (version 2) serialization of a character vector, built by hand."""
    out = b"X\n" + struct.pack(">iii", 2, 0x40200, 0x20300) + struct.pack(">ii", 16, len(values))
    for v in values:
        out += struct.pack(">ii", 9 | (1 << 15), len(v.encode())) + v.encode()
    return out


def test_rdata_reads_a_character_vector():
    assert unserialize(_xdr_strings(["Emma", "", "CHAPTER I"])) == ["Emma", "", "CHAPTER I"]
    with pytest.raises(ConfigError, match="not supported"):
        unserialize(b"A\n" + b"\0" * 12)


def test_rdata_reads_attributes_and_na():
    body = fx.r_strings(["a", None, "b"], {"names": fx.r_strings(["x", "y", "z"]), "class": fx.r_strings(["k"])})
    got = unserialize(fx.r_serialize(body))
    assert got == RObject(["a", None, "b"], {"names": ["x", "y", "z"], "class": ["k"]})
    assert unserialize(fx.r_serialize(fx.r_ints([3, -1, 7]))) == (3, -1, 7)
    with pytest.raises(ConfigError, match="ends early"):
        unserialize(fx.r_serialize(body)[:-3])


# ---- the Austen and KJV readers on the committed fixtures (tests/models/corpus_fixture.py) -------------
FIXTURES = Path(__file__).parent / "data"


def test_fixtures_are_what_the_writer_writes(tmp_path):
    fx.write_all(tmp_path)
    for rel in ("austen/Rdata.rdx", "austen/Rdata.rdb", "bible.data"):
        assert (tmp_path / rel).read_bytes() == (FIXTURES / rel).read_bytes(), rel


def test_lazyload_database_round_trip():
    objects = read_lazyload(FIXTURES / "austen" / "Rdata")
    assert set(objects) == {*fx.NOVELS, "unrelated"}
    assert objects["unrelated"] == (1, 2, 3)
    assert isinstance(objects["emma"], RObject) and objects["emma"].attrs == {"class": ["character"]}
    assert objects["persuasion"] == fx.novel_lines("persuasion", chapters=2 + fx.NOVELS.index("persuasion") % 3)


def test_austen_reader_splits_chapters_on_the_fixture():
    chapters = read_austen(FIXTURES / "austen")
    ids = [doc_id for doc_id, _ in chapters]
    assert len(chapters) == sum(2 + i % 3 for i in range(6)) == 18
    assert ids[:2] == ["emma/chapter001", "emma/chapter002"] and ids[-1] == "sensesensibility/chapter004"
    pride = dict(chapters)["prideprejudice/chapter001"]
    # Hard-wrapped lines are joined into one paragraph; NA lines count as blank.
    assert pride.startswith(f"Pride and Prejudice\n\nChapter 1\n\n{fx.PRIDE_FIRST}\n\n")
    assert "chapter 1 of prideprejudice, wrapped over two lines." in pride
    assert "CHAPTER" not in pride and "by Jane Austen" not in pride


def test_austen_reader_names_a_missing_novel(tmp_path):
    fx.write_lazyload(tmp_path / "Rdata", {"emma": fx.r_strings(["CHAPTER 1", "x"])})
    with pytest.raises(ConfigError, match="'mansfieldpark' is missing"):
        read_austen(tmp_path)
    with pytest.raises(ConfigError, match="r-cran-janeaustenr"):
        read_austen(tmp_path / "nope")


def test_bible_reader_on_the_fixture():
    books = read_bible(FIXTURES / "bible.data")
    assert len(books) == 66
    assert books[0] == ("01_Genesis", f"The Book of Genesis\n\n1:1 {fx.GENESIS_1_1}\n1:2 And a made-up second verse.\n")
    assert books[8][0] == "09_1_Samuel" and books[8][1].startswith("The Book of 1 Samuel\n\n1:1 Verse one of book 9.")
    assert books[-1] == ("66_Revelation", f"The Book of Revelation\n\n22:21 {fx.REVELATION_22_21}\n")


def test_unlzw_round_trip_across_clear_codes():
    data = bytes(range(256)) * 3 + b"tail"  # > 248 literals: the stream holds CLEAR codes
    assert unlzw(fx.lzw_literals(data)) == data


def test_bible_reader_rejects_bad_files(tmp_path):
    bad = tmp_path / "bible.data"
    bad.write_bytes(b"XXXX" + b"\0" * 100)
    with pytest.raises(ConfigError, match="EC02"):
        read_bible(bad)
    short = tmp_path / "short.data"
    fx.write_bible(short, books=fx.BOOK_NAMES[:-1])
    with pytest.raises(ConfigError, match="found 65 books"):
        read_bible(short)


@pytest.mark.skipif(not Path("/usr/lib/bible.data").is_file(), reason="bible-kjv-text is not installed")
def test_bible_reader_finds_66_books_in_the_installed_package():
    books = read_bible()
    assert len(books) == 66
    assert books[0][1].startswith("The Book of Genesis\n\n1:1 In the beginning God created the heaven and the earth.")
    assert books[-1][0] == "66_Revelation"


@pytest.mark.skipif(not Path("/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb").is_file(),
                    reason="r-cran-janeaustenr is not installed")
def test_austen_reader_finds_six_novels_in_the_installed_package():
    chapters = read_austen()
    novels = {doc_id.split("/")[0] for doc_id, _ in chapters}
    assert len(novels) == 6 and len(chapters) > 250
    assert any("It is a truth universally acknowledged" in text for _, text in chapters)
