"""The SQLite store as ``Store``: the synchronous engine (``SyncSQLiteStore``), each
operation run on the store's one thread.

sqlite3 blocks, so every call leaves the event loop for a thread; one thread per store
keeps the connection's use serial without a lock. Each operation of the roles is one line
here, ``on_thread(SyncSQLiteStore.<name>)``: mypy holds the synchronous method's signature
to the role's, so the two cannot drift. What needs the event loop stays async: opening and
closing (the thread's life) and ``wait_for_work``.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Concatenate, ParamSpec, TypeVar

from postlane.core.validation import Limits
from postlane.store.base import Store
from postlane.store.seam import translated
from postlane.store.sqlite._base import sqlite_errors
from postlane.store.sqlite._sync import SyncSQLiteStore

P = ParamSpec("P")
T = TypeVar("T")


def on_thread(method: Callable[Concatenate[SyncSQLiteStore, P], T]
              ) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, T]]:
    """``method`` of the synchronous engine as an async operation of ``SQLiteStore``."""

    async def operation(store: SQLiteStore, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await store._run(functools.partial(method, store._sync, *args, **kwargs))

    operation.__name__ = operation.__qualname__ = method.__name__
    operation.__doc__ = method.__doc__
    return operation


@translated(sqlite_errors)
class SQLiteStore(Store):
    """Every part of the store, over one connection (``SyncSQLiteStore``) used from one
    thread."""

    engine = "sqlite"

    def __init__(self, path: str, *, limits: Limits | None = None) -> None:
        self.path = path
        self._sync = SyncSQLiteStore(path, wake=self._wake)
        super().__init__(limits)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="postlane-sqlite")
        self._wakeup = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def limits(self) -> Limits:
        """The engine's: it validates and counts lanes with them."""
        return self._sync.limits

    @limits.setter
    def limits(self, value: Limits) -> None:
        self._sync.limits = value

    async def _run(self, call: Callable[[], T]) -> T:
        """Run ``call`` on the store's thread."""
        self._loop = loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, call)

    def _wake(self) -> None:
        """The engine's ``wake``, called on the store's thread after a write that gives a
        worker something to do: the in-process waiter wakes (before the write's caller
        resumes, as its result is delivered after this)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wakeup.set)

    # -- what stays async --------------------------------------------------------------------
    async def open(self) -> None:
        await self._run(self._sync.open)

    async def close(self) -> None:
        await self._run(self._sync.close)
        self._thread.shutdown(wait=True)

    async def wait_for_work(self, timeout: float) -> None:
        """Wake on an in-process enqueue, or on a commit by another connection
        (``PRAGMA data_version``), polled every 50 ms."""
        deadline = time.monotonic() + timeout
        start = await self._run(self._sync.data_version)
        while not self._wakeup.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                async with asyncio.timeout(min(0.05, left)):
                    await self._wakeup.wait()
            except TimeoutError:
                if await self._run(self._sync.data_version) != start:
                    break
        self._wakeup.clear()

    template_on_connection = staticmethod(SyncSQLiteStore.template_on_connection)
    """Read a template through the caller's connection (the outbox, ``store.connections``)."""

    # -- StoreLifecycle ----------------------------------------------------------------------
    migrate = on_thread(SyncSQLiteStore.migrate)
    pending_migrations = on_thread(SyncSQLiteStore.pending_migrations)
    # -- ProducerStore -----------------------------------------------------------------------
    enqueue = on_thread(SyncSQLiteStore.enqueue)
    enqueue_many = on_thread(SyncSQLiteStore.enqueue_many)
    enqueue_request = on_thread(SyncSQLiteStore.enqueue_request)
    # -- WorkerStore -------------------------------------------------------------------------
    claim_batch = on_thread(SyncSQLiteStore.claim_batch)
    start_attempts = on_thread(SyncSQLiteStore.start_attempts)
    renew_leases = on_thread(SyncSQLiteStore.renew_leases)
    set_state_if_sending_many = on_thread(SyncSQLiteStore.set_state_if_sending_many)
    set_state_if_ambiguous_many = on_thread(SyncSQLiteStore.set_state_if_ambiguous_many)
    list_ambiguous = on_thread(SyncSQLiteStore.list_ambiguous)
    rescue_expired_leases = on_thread(SyncSQLiteStore.rescue_expired_leases)
    suppressed_among = on_thread(SyncSQLiteStore.suppressed_among)
    attachments_among = on_thread(SyncSQLiteStore.attachments_among)
    delivery_routes = on_thread(SyncSQLiteStore.delivery_routes)
    record_routes = on_thread(SyncSQLiteStore.record_routes)
    record_heartbeat = on_thread(SyncSQLiteStore.record_heartbeat)
    forget_worker = on_thread(SyncSQLiteStore.forget_worker)
    # -- FleetStore --------------------------------------------------------------------------
    get_controls = on_thread(SyncSQLiteStore.get_controls)
    set_control = on_thread(SyncSQLiteStore.set_control)
    compare_and_set_control = on_thread(SyncSQLiteStore.compare_and_set_control)
    stats = on_thread(SyncSQLiteStore.stats)
    deliverability = on_thread(SyncSQLiteStore.deliverability)
    list_workers = on_thread(SyncSQLiteStore.list_workers)
    outcome_minutes = on_thread(SyncSQLiteStore.outcome_minutes)
    provider_event_totals = on_thread(SyncSQLiteStore.provider_event_totals)
    channel_stats = on_thread(SyncSQLiteStore.channel_stats)
    # -- HousekeepingStore -------------------------------------------------------------------
    list_fallback_candidates = on_thread(SyncSQLiteStore.list_fallback_candidates)
    create_sms_fallback = on_thread(SyncSQLiteStore.create_sms_fallback)
    list_waiting_canaries = on_thread(SyncSQLiteStore.list_waiting_canaries)
    settle_import_canary = on_thread(SyncSQLiteStore.settle_import_canary)
    # -- OperatorStore -----------------------------------------------------------------------
    get = on_thread(SyncSQLiteStore.get)
    timeline = on_thread(SyncSQLiteStore.timeline)
    find_deliveries = on_thread(SyncSQLiteStore.find_deliveries)
    list_deliveries = on_thread(SyncSQLiteStore.list_deliveries)
    count_deliveries = on_thread(SyncSQLiteStore.count_deliveries)
    cancel_many = on_thread(SyncSQLiteStore.cancel_many)
    dead_letter = on_thread(SyncSQLiteStore.dead_letter)
    list_dead_letters = on_thread(SyncSQLiteStore.list_dead_letters)
    replay_dead_letters = on_thread(SyncSQLiteStore.replay_dead_letters)
    discard_dead_letter = on_thread(SyncSQLiteStore.discard_dead_letter)
    cancel = on_thread(SyncSQLiteStore.cancel)
    discard_dead_letters = on_thread(SyncSQLiteStore.discard_dead_letters)
    prune = on_thread(SyncSQLiteStore.prune)
    suppress = on_thread(SyncSQLiteStore.suppress)
    unsuppress = on_thread(SyncSQLiteStore.unsuppress)
    list_suppressions = on_thread(SyncSQLiteStore.list_suppressions)
    sms_fallback_pair = on_thread(SyncSQLiteStore.sms_fallback_pair)
    requeue_suppressed = on_thread(SyncSQLiteStore.requeue_suppressed)
    # -- TemplateStore -----------------------------------------------------------------------
    add_template_version = on_thread(SyncSQLiteStore.add_template_version)
    get_template = on_thread(SyncSQLiteStore.get_template)
    list_templates = on_thread(SyncSQLiteStore.list_templates)
    set_template_deprecated = on_thread(SyncSQLiteStore.set_template_deprecated)
    count_template_references = on_thread(SyncSQLiteStore.count_template_references)
    delete_template_if_unreferenced = on_thread(SyncSQLiteStore.delete_template_if_unreferenced)
    enqueue_many_if_template_usable = on_thread(SyncSQLiteStore.enqueue_many_if_template_usable)
    # -- ImportStore -------------------------------------------------------------------------
    start_import = on_thread(SyncSQLiteStore.start_import)
    finish_import = on_thread(SyncSQLiteStore.finish_import)
    get_import = on_thread(SyncSQLiteStore.get_import)
    list_imports = on_thread(SyncSQLiteStore.list_imports)
    start_import_canary = on_thread(SyncSQLiteStore.start_import_canary)
    get_import_canary = on_thread(SyncSQLiteStore.get_import_canary)
    release_import_hold = on_thread(SyncSQLiteStore.release_import_hold)
    import_counts = on_thread(SyncSQLiteStore.import_counts)
    # -- ApiKeyStore -------------------------------------------------------------------------
    create_api_key = on_thread(SyncSQLiteStore.create_api_key)
    get_api_key = on_thread(SyncSQLiteStore.get_api_key)
    list_api_keys = on_thread(SyncSQLiteStore.list_api_keys)
    revoke_api_key = on_thread(SyncSQLiteStore.revoke_api_key)
    end_api_key_sessions = on_thread(SyncSQLiteStore.end_api_key_sessions)
    # -- ProviderEventStore ------------------------------------------------------------------
    record_provider_event = on_thread(SyncSQLiteStore.record_provider_event)
    # -- CallbackStore -----------------------------------------------------------------------
    add_callback_endpoint = on_thread(SyncSQLiteStore.add_callback_endpoint)
    list_callback_endpoints = on_thread(SyncSQLiteStore.list_callback_endpoints)
    disable_callback_endpoint = on_thread(SyncSQLiteStore.disable_callback_endpoint)
    claim_callbacks = on_thread(SyncSQLiteStore.claim_callbacks)
    finish_callbacks = on_thread(SyncSQLiteStore.finish_callbacks)
    list_callbacks = on_thread(SyncSQLiteStore.list_callbacks)
    replay_callbacks = on_thread(SyncSQLiteStore.replay_callbacks)
    callback_counts = on_thread(SyncSQLiteStore.callback_counts)
