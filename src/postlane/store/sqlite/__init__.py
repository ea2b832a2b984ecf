"""The SQLite engine: the embedded default that needs nothing installed.

WAL mode with ``synchronous=FULL``; every write is one ``BEGIN IMMEDIATE`` transaction, so
claims from several processes serialise on SQLite's write lock. Times are REAL unix
seconds computed by SQLite itself (the database clock). The engine is written synchronously
(``SyncSQLiteStore``); ``SQLiteStore`` runs each operation on one thread per store.
"""

from __future__ import annotations

from postlane.store.sqlite._async import SQLiteStore, on_thread
from postlane.store.sqlite._base import SQLiteEngine, connect, sqlite_errors
from postlane.store.sqlite._producing import (
    insert_many,
    insert_one,
    message_params,
)
from postlane.store.sqlite._sync import SyncSQLiteStore

__all__ = [
    "SQLiteEngine",
    "SQLiteStore",
    "SyncSQLiteStore",
    "connect",
    "insert_many",
    "insert_one",
    "message_params",
    "on_thread",
    "sqlite_errors",
]
