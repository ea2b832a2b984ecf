"""The operator dashboard (server-rendered Jinja2, a little JavaScript), served at
``/dashboard`` by the API app."""

from __future__ import annotations

from postlane.extras import requires

with requires("server", "the dashboard"):
    from postlane.dashboard.views import mount

__all__ = ["mount"]
