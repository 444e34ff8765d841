# Two entry points: `make demo` and `make test`. Both create .venv when it is missing.
# Also: `make docs` (the MkDocs site, offline, into site/), `make bench` (every benchmark in quick mode,
# JSON under out/bench/), `make results` (renders that JSON into docs/results/ and the README table).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test docs bench results

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/routecast demo --model builtin-fine --overwrite

test: $(STAMP)
	$(BIN)/python -m pytest
	$(BIN)/ruff check routecast tests benchmarks scripts
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(BIN)/python scripts/run_benchmarks.py

results: $(STAMP)
	$(BIN)/python -m routecast.report.results --bench out/bench --docs docs --readme README.md
