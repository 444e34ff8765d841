"""Trace type, on-disk format, capture, importers, synthetic traces and routing statistics."""

from routecast.trace.spec import MoESpec
from routecast.trace.trace import COLUMNS, DECODE, PHASES, PREFILL, Trace, make_columns

__all__ = ["COLUMNS", "DECODE", "PHASES", "PREFILL", "MoESpec", "Trace", "make_columns"]
