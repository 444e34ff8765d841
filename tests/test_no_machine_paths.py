"""A fresh clone must run what the README, the docs and the benchmarks say: no absolute machine path in them."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a literal path into one machine's private folders; tempfile.gettempdir() is how code names a temp dir
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|home|tmp|scratch|data|mnt|Users)/")


def _files():
    yield ROOT / "README.md"
    yield ROOT / "mkdocs.yml"
    yield from sorted((ROOT / "docs").rglob("*.md"))
    yield from sorted((ROOT / "benchmarks").rglob("*.py"))
    yield ROOT / "Makefile"


def test_pattern_sees_paths():
    assert MACHINE_PATH.search("--fine /work/data/traces/fine") and MACHINE_PATH.search("'/tmp/x'")
    assert MACHINE_PATH.search("cd /home/me/x") and not MACHINE_PATH.search("out/traces/fine docs/work/x")


def test_no_absolute_machine_path():
    bad = []
    for f in _files():
        if not f.is_file():
            continue
        for i, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            if MACHINE_PATH.search(line):
                bad.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()[:120]}")
    assert not bad, "absolute machine paths (use standard_trace or a relative path):\n" + "\n".join(bad)


def test_readme_is_short_and_its_figures_are_rendered():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250, "README.md is over 250 lines: move detail to docs/"
    assert "<!-- results:summary -->" in text and "<!-- /results -->" in text  # the one generated table
