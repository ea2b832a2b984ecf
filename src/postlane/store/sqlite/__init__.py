"""The SQLite engine: the embedded default that needs nothing installed.

WAL mode with ``synchronous=FULL``; every write is one ``BEGIN IMMEDIATE`` transaction, so
claims from several processes serialise on SQLite's write lock. Times are REAL unix
seconds computed by SQLite itself (the database clock). Calls run on one thread per store.
"""

from __future__ import annotations

from postlane.store.seam import translated
from postlane.store.sqlite._base import NOW, SQLiteBase, connect, sqlite_errors
from postlane.store.sqlite._callbacks import CallbacksMixin
from postlane.store.sqlite._claims import ClaimsMixin
from postlane.store.sqlite._http_api import HttpApiMixin
from postlane.store.sqlite._on_call import OnCallMixin
from postlane.store.sqlite._operating import OperatingMixin
from postlane.store.sqlite._producing import (
    INSERT_DELIVERY,
    INSERT_ONE,
    ProducingMixin,
    insert_many,
    insert_one,
    message_params,
)
from postlane.store.sqlite._provider_events import ProviderEventsMixin
from postlane.store.sqlite._routes import RoutesMixin
from postlane.store.sqlite._second_channel import SecondChannelMixin
from postlane.store.sqlite._templates import TemplatesMixin

__all__ = [
    "INSERT_DELIVERY",
    "INSERT_ONE",
    "NOW",
    "SQLiteBase",
    "SQLiteStore",
    "connect",
    "insert_many",
    "insert_one",
    "message_params",
]


@translated(sqlite_errors)
class SQLiteStore(
    ProducingMixin,
    ClaimsMixin,
    OperatingMixin,
    OnCallMixin,
    ProviderEventsMixin,
    TemplatesMixin,
    HttpApiMixin,
    SecondChannelMixin,
    RoutesMixin,
    CallbacksMixin,
):
    """Every part of the store, over one connection (see ``_base.SQLiteBase``)."""
