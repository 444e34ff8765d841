"""report/results.py: benchmark JSON -> docs/results pages and filled regions; nothing typed by hand."""

import json

import pytest

from routecast.common.bench import table, write_bench
from routecast.common.errors import ConfigError
from routecast.report.results import fill_regions, fmt, main, md_table, render_all, render_page


def _bench(d, name, quick=True, **kw):
    return write_bench(name, title=f"{name} title", headline=[f"{name}: 1.25x faster", "second line"],
                       tables=[table("speeds", [{"arm": "a", "us": 1.23456}, {"arm": "b", "us": 2.0, "extra": None}],
                                     note="medians of 3")],
                       quick=quick, path=d / f"{name}.json", **kw)


def test_fmt_and_table():
    assert fmt(1.23456) == "1.235" and fmt(2.0) == "2" and fmt(None) == "–" and fmt(123456) == "123,456"
    assert fmt(True) == "yes" and fmt("a|b") == "a\\|b" and fmt([1, 2.5]) == "1, 2.5"
    t = md_table([{"a": 1}, {"a": 2, "b": 3}])
    assert t.splitlines()[0] == "| a | b |" and t.splitlines()[2] == "| 1 | – |" and t.splitlines()[3] == "| 2 | 3 |"
    assert "3 more rows" in md_table([{"a": i} for i in range(5)], max_rows=2)


def test_page_has_provenance_headline_and_tables(tmp_path):
    doc = json.loads(_bench(tmp_path, "x").read_text())
    page = render_page(doc)
    assert page.startswith("# x title\n") and "quick run" in page and "- x: 1.25x faster" in page
    assert "## speeds" in page and "| a | 1.235 | – |" in page and "medians of 3" in page
    assert doc["machine"]["cpu"] in page
    assert "full run" in render_page({**doc, "quick": False})


def test_render_all_pages_regions_and_stale(tmp_path):
    bench, docs = tmp_path / "bench", tmp_path / "docs"
    bench.mkdir()
    _bench(bench, "alpha")
    _bench(bench, "beta", quick=False)
    (bench / "junk.json").write_text("{}")  # not the bench shape: skipped with a note, never rendered
    (docs / "systems").mkdir(parents=True)
    (docs / "results").mkdir()
    (docs / "results" / "gone.md").write_text("# old figures\n")
    page = docs / "systems" / "p.md"
    page.write_text("intro\n<!-- results:alpha -->\nhand-typed 9.9x\n<!-- /results -->\nmid\n"
                    "<!-- results:beta/table:0 -->\n<!-- /results -->\n<!-- results:missing -->x<!-- /results -->\n"
                    "<!-- results:alpha-cuda -->\n<!-- /results -->\nend\n")
    readme = tmp_path / "README.md"
    readme.write_text("# r\n<!-- results:summary -->\n<!-- /results -->\n")
    notes = render_all(bench, docs, readme)
    assert any("junk.json" in n for n in notes)
    assert sorted(p.name for p in (docs / "results").glob("*.md")) == ["alpha.md", "beta.md", "index.md"]
    text = page.read_text()
    assert "hand-typed" not in text and "- alpha: 1.25x faster" in text and "(../results/alpha.md)" in text
    assert "**speeds**" in text and "full run" in text and text.startswith("intro\n") and text.endswith("end\n")
    assert "No results yet: `python benchmarks/missing.py --quick` (or `make bench`) writes it" in text
    assert "`python benchmarks/alpha.py` writes it in its cuda variant (out/bench/alpha-cuda.json)" in text
    r = readme.read_text()
    assert "[alpha](docs/results/alpha.md)" in r and "alpha: 1.25x faster" in r and "| quick |" in r
    assert "[beta](beta.md)" in (docs / "results" / "index.md").read_text()
    assert all("junk.json" in n for n in render_all(bench, docs, readme))  # second run: nothing rewritten


def test_bad_region_spec_named(tmp_path):
    with pytest.raises(ConfigError, match="not understood"):
        fill_regions("<!-- results:a b -->\n<!-- /results -->", {}, "")
    _bench(tmp_path, "x")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "p.md").write_text("<!-- results:x/table:5 -->\n<!-- /results -->")
    assert main(["--bench", str(tmp_path), "--docs", str(docs), "--readme", ""]) == 2


def test_absolute_paths_rendered_portable():
    from routecast.report.results import portable

    d = portable({"command": "python b.py --hardware /srv/x/cal.toml --trace /data/t/fine", "rows": [{"p": "/a/b/c.json"}],
                  "keep": ["docs/results/x.md", "3/4", "http://h/a/b"]})
    assert d["command"] == "python b.py --hardware LOCAL/cal.toml --trace LOCAL/fine"
    assert d["rows"] == [{"p": "LOCAL/c.json"}] and d["keep"] == ["docs/results/x.md", "3/4", "http://h/a/b"]


def test_readme_summary_lists_every_results_page_and_links_it():
    """The README's summary has the rows of docs/results/index.md (links into docs/results/), and every linked page
    exists: a render into a scratch folder spliced in by hand cannot drop rows or leave a dangling link."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    region = readme[readme.index("<!-- results:summary -->"):readme.index("<!-- /results -->")]
    got = [ln for ln in region.splitlines() if ln.startswith("| [")]
    index = [ln for ln in (root / "docs/results/index.md").read_text().splitlines() if ln.startswith("| [")]
    assert got == [re.sub(r"\]\(([^)]+)\)", r"](docs/results/\1)", ln, count=1) for ln in index]
    pages = {p.stem for p in (root / "docs/results").glob("*.md")} - {"index"}
    linked = [re.match(r"\| \[[^\]]+\]\(([^)]+)\.md\)", ln).group(1) for ln in index]
    assert sorted(linked) == sorted(pages)


def test_only_refreshes_the_named_benchmarks_and_keeps_every_other_page_and_region(tmp_path, capsys):
    bench, docs = tmp_path / "bench", tmp_path / "docs"
    bench.mkdir()
    _bench(bench, "alpha")
    (docs / "results").mkdir(parents=True)
    (docs / "results" / "gamma.md").write_text("# gamma from another run\n")  # its JSON is not here: kept
    (docs / "results" / "index.md").write_text("# Results\n\n| benchmark | headline | run | load |\n|---|---|---|---|\n"
                                               "| [alpha](alpha.md) | old | quick | 1 |\n"
                                               "| [gamma](gamma.md) | gamma 2.0x | full | 1 |\n")
    page = docs / "p.md"
    page.write_text("<!-- results:alpha -->\nold alpha\n<!-- /results -->\n"
                    "<!-- results:gamma -->\ngamma 2.0x\n<!-- /results -->\n<!-- results:summary -->\nS\n<!-- /results -->\n")
    render_all(bench, docs, None, only=["alpha"])
    text = page.read_text()
    assert "- alpha: 1.25x faster" in text and "old alpha" not in text
    assert "gamma 2.0x" in text and "[gamma](results/gamma.md)" in text and "\nS\n" not in text
    assert sorted(p.name for p in (docs / "results").glob("*.md")) == ["alpha.md", "gamma.md", "index.md"]
    rows = [r for r in (docs / "results" / "index.md").read_text().splitlines() if r.startswith("| [")]
    assert rows[0].startswith("| [alpha](alpha.md) | alpha: 1.25x faster |") and len(rows) == 2
    assert rows[1] == "| [gamma](gamma.md) | gamma 2.0x | full | 1 |"
    before = page.read_text()
    for only, needle in (("gamma", "no "), (",", "names no benchmark")):
        capsys.readouterr()
        assert main(["--bench", str(bench), "--docs", str(docs), "--readme", "", "--only", only]) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and len(err.splitlines()) == 1, err
    assert page.read_text() == before
    capsys.readouterr()  # a docs folder that is not there is named, never created
    assert main(["--bench", str(bench), "--docs", str(tmp_path / "nope"), "--readme", "", "--only", "alpha"]) == 2
    assert "--docs" in capsys.readouterr().err and not (tmp_path / "nope").exists()
    readme = tmp_path / "README.md"  # the summary: the merged index's rows, links into docs/results/
    readme.write_text("<!-- results:summary -->\nold\n<!-- /results -->\n")
    render_all(bench, docs, readme, only=["alpha"])
    assert [ln for ln in readme.read_text().splitlines() if ln.startswith("| [")] == [
        r.replace("](", "](docs/results/", 1) for r in (docs / "results" / "index.md").read_text().splitlines()
        if r.startswith("| [")]
