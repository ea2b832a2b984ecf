"""Postlane's HTTP API, dashboard and metrics endpoint: ``create_app(store_url)``.

Serve it with ``postlane serve`` (uvicorn), or mount the app in your own ASGI server.
"""

from __future__ import annotations

from postlane.api.app import create_app

__all__ = ["create_app"]
