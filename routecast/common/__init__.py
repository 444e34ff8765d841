"""Small helpers used everywhere; imports none of routecast's other packages."""

from routecast.common.errors import ConfigError, RoutecastError, TraceError, check

__all__ = ["ConfigError", "RoutecastError", "TraceError", "check"]
