"""A pytest plugin for applications that enqueue through Postlane: what did my code enqueue,
and what would the worker send?

Enable it in the application's ``conftest.py``::

    pytest_plugins = ["postlane.testing"]

and point it at the database the application enqueues into: the ``postlane_url`` fixture
is ``$POSTLANE_DATABASE_URL``, else (with Django configured) the store of
``postlane.django``, else override it in a ``conftest.py``. The database must be migrated
(``postlane migrate`` / ``manage.py postlane_migrate``).

- ``postlane_outbox`` (an ``Outbox``): the deliveries enqueued since the test began, read
  as committed rows through a connection of its own, or through the test's connection
  (``conn=...``: the same transaction, for a test that never commits, e.g. Django's
  ``TestCase``). ``assert_enqueued(to=..., key=..., lane=..., template=...)`` finds exactly
  one and says what there was when it does not.
- ``Outbox.drain()`` runs a real worker against the in-process sandbox provider until
  nothing is pending, and returns the deliveries it sent: the end-to-end check, without an
  email provider. (A delayed delivery is pending until it is due: drain times out.)

Not to be confused with ``postlane.providers.testing`` (providers for Postlane's own tests).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from postlane.core.lanes import DEFAULT_LANES, LaneConfig
from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome, OutcomeClass
from postlane.providers.base import Provider
from postlane.providers.sandbox import SandboxProvider
from postlane.store import DATABASE_URL_ENV, open_store
from postlane.store.connections import deliveries_after, last_delivery_id, own_connection

__all__ = ["Enqueued", "Outbox", "RecordingSandbox", "drain", "drain_async"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Enqueued:
    """One delivery as the assertions see it (``store.connections.DELIVERY_SUMMARY``)."""

    id: int
    key: str
    to: str
    lane: str
    template: str | None
    subject: str
    state: str


class RecordingSandbox(Provider):
    """The sandbox provider (or another), keeping every delivery it accepted."""

    name = "sandbox"

    def __init__(self, inner: Provider | None = None) -> None:
        self.inner = inner or SandboxProvider()
        self.capabilities = self.inner.capabilities
        self.sent: list[Delivery] = []

    async def send(self, delivery: Delivery) -> Outcome:
        outcome = await self.inner.send(delivery)
        if outcome.kind is OutcomeClass.ACCEPTED:
            self.sent.append(delivery)
        return outcome

    async def lookup(self, key: str) -> Outcome | None:
        return await self.inner.lookup(key)


async def drain_async(url: str, provider: Provider | None = None, *,
                      lanes: tuple[LaneConfig, ...] = DEFAULT_LANES,
                      timeout: float = 30.0) -> list[Delivery]:
    """Run a worker on ``url`` until nothing is pending or sending; the deliveries the
    provider (by default the sandbox) accepted, in the order it accepted them."""
    from postlane.worker import Worker, WorkerConfig

    recorder = RecordingSandbox(provider)
    config = WorkerConfig(drain=True, lanes=lanes, concurrency=8, batch_size=8,
                          poll_interval_s=0.05, rescue_interval_s=0.2,
                          controls_interval_s=0.05)
    async with open_store(url) as store:
        await asyncio.wait_for(Worker(store, recorder, config=config).run(), timeout)
    return recorder.sent


def drain(url: str, provider: Provider | None = None, *,
          lanes: tuple[LaneConfig, ...] = DEFAULT_LANES, timeout: float = 30.0
          ) -> list[Delivery]:
    """``drain_async`` from synchronous code (a test function that is not ``async``)."""
    return asyncio.run(drain_async(url, provider, lanes=lanes, timeout=timeout))


class Outbox:
    """The deliveries in ``url`` with an id above ``since`` (those of the current test)."""

    def __init__(self, url: str, *, since: int | None = None) -> None:
        self.url = url
        self.since = self._max_id() if since is None else since

    def _with(self, conn: Any, read: Callable[[Any], _T]) -> _T:
        """``read`` through ``conn``, or through a connection of its own (committed rows)."""
        if conn is not None:
            return read(conn)
        with own_connection(self.url) as own:
            return read(own)

    def _max_id(self) -> int:
        return self._with(None, last_delivery_id)

    def all(self, conn: Any = None) -> list[Enqueued]:
        """Every delivery enqueued since the test began, oldest first: committed ones, or
        with ``conn`` what that connection's transaction sees (its own uncommitted ones)."""
        rows = self._with(conn, lambda c: deliveries_after(c, self.since))
        return [Enqueued(*row) for row in rows]

    def find(self, *, to: str | None = None, key: str | None = None, lane: str | None = None,
             template: str | None = None, conn: Any = None) -> list[Enqueued]:
        """The deliveries matching every criterion given."""
        wanted = {"to": to, "key": key, "lane": lane, "template": template}
        return [e for e in self.all(conn)
                if all(v is None or getattr(e, k) == v for k, v in wanted.items())]

    def assert_enqueued(self, *, to: str | None = None, key: str | None = None,
                        lane: str | None = None, template: str | None = None,
                        conn: Any = None) -> Enqueued:
        """The one delivery matching; an ``AssertionError`` listing what there is if none
        or several match."""
        found = self.find(to=to, key=key, lane=lane, template=template, conn=conn)
        if len(found) != 1:
            wanted = {k: v for k, v in
                      {"to": to, "key": key, "lane": lane, "template": template}.items() if v}
            there = "\n".join(f"  {e}" for e in self.all(conn)) or "  (nothing)"
            raise AssertionError(f"expected one delivery matching {wanted}, found "
                                 f"{len(found)}; enqueued since the test began:\n{there}")
        return found[0]

    def assert_nothing_enqueued(self, conn: Any = None) -> None:
        found = self.all(conn)
        if found:
            raise AssertionError("expected nothing enqueued, found:\n"
                                 + "\n".join(f"  {e}" for e in found))

    def drain(self, provider: Provider | None = None, *, timeout: float = 30.0
              ) -> list[Delivery]:
        """``drain`` on this outbox's database (committed deliveries only)."""
        return drain(self.url, provider, timeout=timeout)


# -- the fixtures --------------------------------------------------------------------------
@pytest.fixture
def postlane_url() -> str:
    """The database the application enqueues into; override it in a ``conftest.py``."""
    url = os.environ.get(DATABASE_URL_ENV)
    if url:
        return url
    try:
        from django.conf import settings
    except ImportError:
        settings = None
    if settings is not None and settings.configured:
        from postlane.django.conf import store_url

        return store_url()
    raise pytest.UsageError(
        f"postlane.testing needs the database your code enqueues into: set {DATABASE_URL_ENV}"
        ", configure Django, or override the `postlane_url` fixture in a conftest.py")


@pytest.fixture
def postlane_outbox(postlane_url: str) -> Iterator[Outbox]:
    """What the test enqueued (see ``Outbox``); also empties ``postlane.django.outbox``."""
    _clear_django_outbox()
    yield Outbox(postlane_url)
    _clear_django_outbox()


def _clear_django_outbox() -> None:
    import sys

    backend = sys.modules.get("postlane.django.backend")
    if backend is not None:
        backend.outbox.clear()
