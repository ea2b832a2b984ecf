"""The PostgreSQL engine (psycopg 3, async, pooled): the production store for many hosts.

Claims use ``FOR UPDATE SKIP LOCKED``; every state write is one statement guarded by
state, lease owner and claim number; lease times come from the database clock (``now()``).
"""

from __future__ import annotations

from postlane.extras import requires
from postlane.store.seam import translated

with requires("postgres", "a PostgreSQL database"):
    from postlane.store.postgres._base import postgres_errors
    from postlane.store.postgres._callbacks import CallbacksMixin
    from postlane.store.postgres._claims import ClaimsMixin
    from postlane.store.postgres._http_api import HttpApiMixin
    from postlane.store.postgres._on_call import OnCallMixin
    from postlane.store.postgres._operating import OperatingMixin
    from postlane.store.postgres._producing import (
        ProducingMixin,
        enqueue_many_on_connection,
        enqueue_many_on_sync_connection,
        enqueue_on_connection,
        enqueue_on_sync_connection,
    )
    from postlane.store.postgres._provider_events import ProviderEventsMixin
    from postlane.store.postgres._routes import RoutesMixin
    from postlane.store.postgres._second_channel import SecondChannelMixin
    from postlane.store.postgres._templates import TemplatesMixin

__all__ = [
    "PostgresStore",
    "enqueue_many_on_connection",
    "enqueue_many_on_sync_connection",
    "enqueue_on_connection",
    "enqueue_on_sync_connection",
]


@translated(postgres_errors)
class PostgresStore(
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
    """Every part of the store, over one pool (see ``_base.PostgresBase``)."""
