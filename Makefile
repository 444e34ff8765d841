# Two entry points: `make demo` and `make test`. Both create .venv when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/routecast demo --model builtin-fine --overwrite

test: $(STAMP)
	$(BIN)/python -m pytest
	$(BIN)/ruff check routecast tests benchmarks
