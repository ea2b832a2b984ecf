"""Postlane's HTTP API, dashboard and metrics endpoint: ``create_app(store_url)``.

Serve it with ``postlane serve`` (uvicorn), or mount the app in your own ASGI server.
``create_app`` is imported on first use, so that ``postlane worker`` (which only needs
``postlane.api.keys`` through the CLI) does not load FastAPI at start-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from postlane.api.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from postlane.extras import requires

        with requires("server", "the HTTP API"):
            from postlane.api.app import create_app

        return create_app
    raise AttributeError(f"module 'postlane.api' has no attribute {name!r}")
