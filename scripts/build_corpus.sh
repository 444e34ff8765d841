#!/usr/bin/env bash
# Rebuild routecast's multi-domain corpus from its sources on a fresh Debian 12 (bookworm) machine.
#
#   scripts/build_corpus.sh [OUT_DIR] [SAMPLE_DIR]
#
# OUT_DIR     full corpus (default: corpus_build, git-ignored; ~30 MB of text, ~9 MB gzip)
# SAMPLE_DIR  also rewrite the compact sample that ships in the package (default: none; pass
#             routecast/models/data to refresh it)
#
# Needs root (apt-get) and network access (Debian mirror, PyPI). Sources, licences and the split
# rule are described in routecast/models/corpus.py; the result is byte-identical across rebuilds
# with the same package versions (bible-kjv-text 4.38, r-cran-janeaustenr 1.0.0-1,
# python3.11-doc 3.11.2-6+deb12u*, gensim 4.4.0).
set -euo pipefail

OUT_DIR="${1:-corpus_build}"
SAMPLE_DIR="${2:-}"
PY="${PYTHON:-.venv/bin/python}"
WHEEL_DIR="${GENSIM_WHEEL_DIR:-/tmp/gensim-wheel}"

if ! dpkg -s python3.11-doc r-cran-janeaustenr bible-kjv-text >/dev/null 2>&1; then
    apt-get update
    apt-get install -y --no-install-recommends python3.11-doc r-cran-janeaustenr bible-kjv-text
fi

# The Wikipedia sample lives in gensim's test data; read it out of the wheel, never install gensim.
mkdir -p "$WHEEL_DIR"
WHEEL="$(ls "$WHEEL_DIR"/gensim-4.4.0-*.whl 2>/dev/null | head -n 1 || true)"
if [ -z "$WHEEL" ]; then
    "$PY" -m pip download --no-deps --only-binary=:all: gensim==4.4.0 -d "$WHEEL_DIR"
    WHEEL="$(ls "$WHEEL_DIR"/gensim-4.4.0-*.whl | head -n 1)"
fi

ARGS=(build --out "$OUT_DIR" --gensim-wheel "$WHEEL" --overwrite)
if [ -n "$SAMPLE_DIR" ]; then
    ARGS+=(--sample-out "$SAMPLE_DIR")
fi
"$PY" -m routecast.models.corpus "${ARGS[@]}"
