"""The one numeric-flag parser: every numeric flag of every subcommand uses it; bad numbers are one sentence."""

from __future__ import annotations

import argparse
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from routecast.common import numbers as N
from routecast.common.errors import ConfigError

# Flags whose text holds numbers in a syntax of their own, parsed (and bounded) by the named function.
TEXT_NUMBERS = {
    "--rates": "sim/serve_cli.py parse_rates", "--slo-ttft": "sim/serve.py parse_slo",
    "--slo-tpot": "sim/serve.py parse_slo", "--reuse": "cache/emoe_cli.py _periods",
}


def all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """(command, parser) for routecast and every subparser, plus the commands that own their parsers."""
    from routecast.cli import build_parser
    from routecast.models import corpus, train
    from routecast.place.export_cli import build_parser as export_parser

    out = []
    for p in (build_parser(), export_parser(), train.build_parser(), corpus.build_parser()):
        out.extend(N.walk(p))
    return out


def test_every_numeric_flag_uses_the_shared_parser():
    bad, seen = [], 0
    for cmd, p in all_parsers():
        for act in p._actions:
            if not act.option_strings or act.nargs == 0 or isinstance(act, argparse._HelpAction):
                continue
            flag = act.option_strings[-1]
            numeric_default = isinstance(act.default, int | float) and not isinstance(act.default, bool)
            if isinstance(act.type, N.NUMERIC_TYPES):
                seen += 1
            elif act.type in (int, float) or (numeric_default and act.choices is None):
                bad.append(f"{cmd} {flag}")
            elif flag in ("--budget",):
                bad.append(f"{cmd} {flag} (a budget: use numbers.budget_text)")
    assert not bad, f"numeric flags not parsed by routecast.common.numbers: {bad}"
    assert seen >= 80, seen  # the walk really reached the subcommands


def test_text_numbers_are_parsed_by_their_own_checked_parsers():
    flags = {a.option_strings[-1] for _, p in all_parsers() for a in p._actions if a.option_strings}
    assert set(TEXT_NUMBERS) <= flags


def test_help_states_the_bounds():
    from routecast.cli import build_parser

    sub = dict(N.walk(build_parser()))
    text = sub["routecast run"].format_help() if "routecast run" in sub else sub["run"].format_help()
    assert f"[1, {4 * N.cores()}]" in text.replace("\n", " ").replace("  ", " ")
    text = sub["ep"].format_help()
    assert "core(s) of this machine" in text


@pytest.mark.parametrize("text,why", [
    ("nan", "not finite"), ("inf", "not finite"), ("-inf", "not finite"), ("1e308", "expected"),
    ("9" * 400, "400-character"), ("-1", "expected"), ("abc", "not a number"), ("", "not a number"),
])
def test_real_refuses(text, why):
    with pytest.raises(argparse.ArgumentTypeError, match=why):
        N.real(0.0, 10.0)(text)


@pytest.mark.parametrize("text,why", [
    ("1.5", "not a whole number"), ("1e3", "not a whole number"), ("9" * 400, "400-character"),
    ("-1", "expected"), ("nan", "not a whole number"), ("0x10", "not a whole number"), ("4294967296", "expected"),
])
def test_seed_refuses(text, why):
    with pytest.raises(argparse.ArgumentTypeError, match=why):
        N.seed()(text)


def test_machine_bounds():
    assert N.threads().hi == 2 * N.cores() and N.nproc().hi == 4 * N.cores()
    assert N.loader_threads().hi == 4 * N.cores()
    n = N.count_by_memory(1 << 20)
    assert n.hi == N.memory_bytes() // 2 // (1 << 20)


@given(st.integers())
def test_integer_accepts_exactly_the_range(v):
    num = N.integer(-5, 1000)
    if -5 <= v <= 1000:
        assert num(str(v)) == v and num(v) == v
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            num(str(v))
        with pytest.raises(ConfigError, match=r"^--x is"):
            num.check(v, "--x")


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_real_accepts_exactly_finite_values_in_range(v):
    num = N.real(0.0, 1.0, lo_open=True)
    ok = math.isfinite(v) and 0 < v <= 1
    if ok:
        assert num(repr(v)) == v
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            num(repr(v))


@given(st.text(max_size=60))
def test_integer_never_raises_anything_else(s):
    try:
        N.positive(100)(s)
    except argparse.ArgumentTypeError as e:
        assert str(e).startswith("is ") and str(e).endswith(".")


@pytest.mark.parametrize("text", ["0", "-5%", "0%", "nan", "inf%", "1" * 400, "12XB", "", "50%,"])
def test_budget_text_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        N.budget_text()(text)


@pytest.mark.parametrize("text", ["50%", "96", "12GB", "800MiB", "0.5"])
def test_budget_text_accepts(text):
    assert N.budget_text()(text) == text


def test_max_new_tokens_bounded_by_the_context():
    assert N.check_max_new_tokens(10, 1024, 100) == 10
    with pytest.raises(ConfigError, match="1..924"):
        N.check_max_new_tokens(100000, 1024, 100)
    with pytest.raises(ConfigError, match="fills the model"):
        N.check_max_new_tokens(1, 1024, 1024)


@pytest.mark.parametrize("argv,expect", [
    (["serve-sim", "--cv", "1e308"], "--cv is 1e308"),
    (["cache", "replay", "t", "--seed", "-1"], "--seed is -1"),
    (["cache", "replay", "t", "--threads", "1000000"], "--threads is 1000000"),
    (["cache", "replay", "t", "--budget", "9" * 400], "--budget is"),
    (["run", "--loader-threads", "10000"], "--loader-threads is 10000"),
    (["ep", "run", "--nproc", "64"], "--nproc is 64"),
    (["ep", "calibrate", "--threads", "0"], "--threads is 0"),
    (["serve-sim", "--requests", str(10**9)], "--requests is 1000000000"),
    (["place", "export", "static", "--num-layers", "2000000", "--out", "x.json"], "--num-layers is 2000000"),
    (["place", "export", "static", "--redundant", "100000", "--out", "x.json"], "--redundant is 100000"),
    (["train-builtin", "--steps", "1.5", "--out", "x"], "--steps is '1.5'"),
])
def test_cli_refuses_with_one_sentence(argv, expect, capsys):
    from routecast.cli import main

    assert main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and ": error: " in err[0] and expect in err[0], err


def test_run_max_new_tokens_is_bounded_by_the_models_positions(capsys):
    from routecast.cli import main

    assert main(["run", "--max-new-tokens", "100000", "--prompts", "corpus:val:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--max-new-tokens is 100000" in err and "positions" in err, err
