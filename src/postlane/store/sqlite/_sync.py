"""The SQLite engine whole, synchronous: every part of the store over one connection."""

from __future__ import annotations

from postlane.store.sqlite._callbacks import CallbacksMixin
from postlane.store.sqlite._claims import ClaimsMixin
from postlane.store.sqlite._http_api import HttpApiMixin
from postlane.store.sqlite._on_call import OnCallMixin
from postlane.store.sqlite._operating import OperatingMixin
from postlane.store.sqlite._producing import ProducingMixin
from postlane.store.sqlite._provider_events import ProviderEventsMixin
from postlane.store.sqlite._routes import RoutesMixin
from postlane.store.sqlite._second_channel import SecondChannelMixin
from postlane.store.sqlite._templates import TemplatesMixin


class SyncSQLiteStore(
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
    """Every operation of ``Store`` under the same name, as a plain method that runs its SQL
    in the calling thread (see ``_base.SQLiteEngine``); ``SQLiteStore`` is the async face."""
