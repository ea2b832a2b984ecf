"""The store's roles: each consumer names the part of the store it uses.

``Store`` (``store.base``) is their union and every engine implements it whole; a consumer
takes the narrowest role that does its job, so a reader sees at the signature what it may
do to the database (the worker cannot replay a dead letter, the webhook receiver can only
record events) and a test double implements one role, not fifty operations. Each role says
who uses it. Operations are named for what they guard; the records they take and return
are in ``postlane.core.records``.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, Protocol

from postlane.core.attachments import Attachment
from postlane.core.deliverability import DEFAULT_POLICY, SuppressionPolicy
from postlane.core.message import EMAIL, Delivery, EnqueueResult, Message
from postlane.core.records import (
    ApiKey,
    Callback,
    CallbackEndpoint,
    CallbackResult,
    ChannelStats,
    Claim,
    Control,
    DeadLetter,
    DeadLetterFilter,
    DeliveryFilter,
    Event,
    FallbackPair,
    ImportCanary,
    ImportCounts,
    ImportProgress,
    ImportRecord,
    LaneDeliverability,
    OutcomeMinute,
    ProviderEvent,
    ProviderEventResult,
    RescueResult,
    Route,
    Stats,
    Suppression,
    TemplateDeletion,
    TemplateVersion,
    Transition,
    WorkerHeartbeat,
    WorkerSeen,
)
from postlane.core.validation import Limits


class StoreLifecycle(Protocol):
    """Opening, closing and the schema. Used by whoever owns a store's life, not its traffic:
    the CLI's commands, the API's lifespan, ``postlane check``, Django's
    ``postlane_migrate``."""

    engine: str
    """``postgres`` or ``sqlite``."""

    @abc.abstractmethod
    async def open(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def migrate(self) -> list[str]:
        """Apply pending migrations; returns the names applied (empty when up to date)."""

    @abc.abstractmethod
    async def pending_migrations(self) -> list[str]: ...


class ProducerStore(Protocol):
    """Writing deliveries, each in its own transaction. Used by ``postlane enqueue``, the
    demo and the HTTP API's ``POST /v1/messages`` (``api.submit``). The outbox form, inside
    the application's transaction, is ``postlane.enqueue`` (``store.connections``), not a
    store."""

    limits: Limits
    """What ``validate`` holds each message to before it is written."""

    @abc.abstractmethod
    async def enqueue(self, message: Message) -> EnqueueResult:
        """Write one delivery in its own transaction (the outbox form is ``postlane.enqueue``)."""

    @abc.abstractmethod
    async def enqueue_many(self, messages: Sequence[Message]) -> list[EnqueueResult]:
        """Write many deliveries in one transaction; existing keys are returned, not re-created."""

    @abc.abstractmethod
    async def enqueue_request(
        self, message: Message, request_hash: str, producer: str
    ) -> tuple[EnqueueResult, str | None]:
        """``enqueue`` for an HTTP request by ``producer`` (``apikey:<id>``): a new delivery
        keeps ``request_hash`` (the hash of the request's canonical body), written in the
        same transaction. Returns the result and the hash kept with the delivery: this one
        when created, the first request's when this producer wrote the key before. A key
        written by another producer raises ``KeyConflict``; content is not compared here
        (the caller compares the request hashes)."""


class FleetStore(Protocol):
    """What every process of a deployment shares: the controls (lane and import pauses, the
    breakers' states) and the four numbers. Used by the worker's breaker and pauses
    (``worker.breaker``, ``worker.controls``), ``postlane status`` (``status``), the
    metrics sampler (``metrics``), and, through ``WorkerStore`` and ``OperatorStore``, by
    the worker and the operators."""

    @abc.abstractmethod
    async def get_controls(self) -> dict[str, Control]:
        """Every control row (lane and import pauses, breaker states), by name."""

    @abc.abstractmethod
    async def set_control(self, name: str, value: Mapping[str, Any] | None) -> None:
        """Write (or, with ``None``, delete) a control unconditionally."""

    @abc.abstractmethod
    async def compare_and_set_control(
        self, name: str, expected_version: int | None, value: Mapping[str, Any]
    ) -> bool:
        """Write ``value`` only if the row is still at ``expected_version`` (``None``: absent)."""

    @abc.abstractmethod
    async def stats(self) -> Stats: ...

    @abc.abstractmethod
    async def deliverability(self, window: timedelta) -> dict[str, LaneDeliverability]:
        """Per lane, deliveries accepted and provider events received within ``window``:
        the bounce and complaint rates providers judge a sender by."""

    @abc.abstractmethod
    async def list_workers(self) -> list[WorkerSeen]:
        """Every worker's last heartbeat (gone ones too, until they are cleaned up), by
        host and pid; ages on the database clock."""

    @abc.abstractmethod
    async def outcome_minutes(self, window: timedelta) -> list[OutcomeMinute]:
        """Outcome counts per minute and lane over the last ``window``, oldest first."""

    @abc.abstractmethod
    async def provider_event_totals(self) -> dict[tuple[str, str], int]:
        """Provider events kept, by (kind, lane; '' when the event matched no delivery)."""

    @abc.abstractmethod
    async def channel_stats(self) -> ChannelStats:
        """Pending deliveries by channel, and SMS fallbacks created by trigger."""


class HousekeepingStore(Protocol):
    """What the worker's housekeeping does besides leases: SMS fallbacks that fell due and
    import canaries to settle, each guarded so a fleet of workers doing it at once acts once.
    Used by ``worker.housekeeping`` (through ``WorkerStore``)."""

    @abc.abstractmethod
    async def list_fallback_candidates(
        self, unsent_after_s: float | None, limit: int = 100
    ) -> list[Delivery]:
        """Emails carrying an SMS fallback (``metadata["sms_fallback"]``) whose fallback is
        not decided yet and may be due: dead or expired, or still pending, sending or
        ambiguous past their own ``after_s`` or, without one, ``unsent_after_s`` (None:
        only their own). Oldest first."""

    @abc.abstractmethod
    async def create_sms_fallback(
        self, email_id: int, states: Sequence[str], message: Message | None, reason: str
    ) -> FallbackPair | None:
        """In one transaction, if the email is still in one of ``states`` and its fallback
        is not decided yet: enqueue ``message`` (key ``sms-fallback:<email key>``; a
        delivery of that key already there is taken as the fallback), record the pair and
        write an event to both timelines. ``message`` None records that no SMS will be sent
        (the policy does not fall back on this). None when the guard did not hold."""

    @abc.abstractmethod
    async def list_waiting_canaries(self, limit: int = 100) -> list[ImportCanary]:
        """Canaries not settled yet, with their deliveries counted by state."""

    @abc.abstractmethod
    async def settle_import_canary(self, import_id: str, passed: bool, reason: str) -> bool:
        """Mark a waiting canary passed (releasing the held deliveries in the same
        transaction) or failed; False when it was settled already."""


class WorkerStore(FleetStore, HousekeepingStore, Protocol):
    """The worker's path, every operation guarded so a worker moves only the deliveries it
    holds (River-style: claim, start, renew, set state if sending, rescue, reconcile). Used
    by ``postlane.worker`` and its collaborators (the runner, the lease keeper, the
    rescuer, the reconciler) and nothing else."""

    @abc.abstractmethod
    async def claim_batch(
        self, lane: str, limit: int, owner: str, lease: timedelta,
        exclude_imports: Sequence[str] = (), channel: str = EMAIL,
    ) -> list[Delivery]:
        """Lease up to ``limit`` ready deliveries of ``lane`` and ``channel`` (the one the
        worker's provider sends) to ``owner``, oldest first, skipping those of paused
        imports. A row that cannot be read back comes as an ``UnreadableDelivery`` (as from
        every read of deliveries), never as an error that fails the batch (see
        ``postlane.store.unreadable``)."""

    @abc.abstractmethod
    async def start_attempts(self, owner: str, claims: Sequence[Claim]) -> set[int]:
        """Record, durably and before the request leaves, that these attempts started.

        Returns the ids whose lease is still live and held by ``owner``; only those may be
        sent. This mark is what lets the rescuer tell "never attempted" from "maybe sent".
        """

    @abc.abstractmethod
    async def renew_leases(
        self, owner: str, claims: Sequence[Claim], lease: timedelta
    ) -> set[int]:
        """Extend live leases held by ``owner``; returns the ids still held."""

    @abc.abstractmethod
    async def set_state_if_sending_many(
        self, owner: str, transitions: Sequence[Transition]
    ) -> set[int]:
        """Apply outcomes in one transaction, each guarded by state, owner and claim number.

        Returns the ids applied. A transition to ``dead`` or ``expired`` also writes the
        dead-letter entry (reason ``expired`` is routed apart: there is nothing to fix).
        """

    @abc.abstractmethod
    async def set_state_if_ambiguous_many(self, transitions: Sequence[Transition]) -> set[int]:
        """Resolve ambiguous deliveries (reconciled as sent, requeued, or dead), guarded by
        state and claim number so two reconcilers cannot both act on one."""

    @abc.abstractmethod
    async def list_ambiguous(
        self, limit: int = 100, lanes: Sequence[str] | None = None,
        channel: str | None = None,
    ) -> list[Delivery]:
        """Ambiguous deliveries (of ``lanes`` and ``channel``, default all), oldest first, for
        reconciliation: a worker asks its own provider only about its own channel."""

    @abc.abstractmethod
    async def rescue_expired_leases(self, limit: int = 1000) -> RescueResult: ...

    @abc.abstractmethod
    async def wait_for_work(self, timeout: float) -> None:
        """Return when new work may have arrived (NOTIFY on PostgreSQL) or after ``timeout``."""

    @abc.abstractmethod
    async def suppressed_among(self, deliveries: Sequence[Delivery]) -> dict[int, str]:
        """Which of these deliveries go to a suppressed address (id -> reason)."""

    @abc.abstractmethod
    async def attachments_among(self, ids: Sequence[int]) -> dict[int, tuple[Attachment, ...]]:
        """The parts stored with these deliveries (id -> parts in order; an id without any
        is absent). Read when the messages are built to send, never by a claim."""
    async def delivery_routes(self, ids: Sequence[int]) -> dict[int, Route]:
        """The recorded route of each of these deliveries that has one (failover only)."""

    @abc.abstractmethod
    async def record_routes(self, routes: Sequence[Route]) -> None:
        """Record (replace) the route of each delivery: before the attempt leaves, so an
        ambiguous attempt always knows which provider to ask."""

    @abc.abstractmethod
    async def record_heartbeat(self, heartbeat: WorkerHeartbeat,
                               outcomes: Mapping[tuple[str, str], int]) -> None:
        """Write this worker's heartbeat (times from the database clock) and add
        ``outcomes`` ((lane, outcome) -> count since the last beat) to the current minute,
        in one transaction; minutes older than two days, and workers gone for a day, are
        dropped on the way."""

    @abc.abstractmethod
    async def forget_worker(self, owner: str) -> None:
        """Remove a worker's heartbeat: it stopped cleanly."""


class OperatorStore(FleetStore, Protocol):
    """Reading deliveries and acting on them by hand: timelines and search, dead letters
    (triage, replay, discard), cancel, resolve an ambiguous delivery, prune, and the
    suppression list. Used by ``postlane.dead_letters``, the CLI's ``dlq``, ``cancel``,
    ``resolve``, ``prune`` and ``suppress`` commands, the API's message and dead-letter
    routes, and the dashboard."""

    @abc.abstractmethod
    async def get(self, id_or_key: int | str) -> Delivery | None: ...

    @abc.abstractmethod
    async def attachments_among(self, ids: Sequence[int]) -> dict[int, tuple[Attachment, ...]]:
        """The parts stored with these deliveries: the message preview and its downloads."""

    @abc.abstractmethod
    async def timeline(self, delivery_id: int) -> list[Event]: ...

    @abc.abstractmethod
    async def find_deliveries(
        self, *, key: str | None = None, recipient: str | None = None,
        import_id: str | None = None, limit: int = 100,
    ) -> list[Delivery]:
        """Deliveries by idempotency key, recipient or import, newest first."""

    @abc.abstractmethod
    async def list_deliveries(
        self, selection: DeliveryFilter = DeliveryFilter(), *, before: int | None = None,
        upto_id: int | None = None, limit: int = 100,
    ) -> list[Delivery]:
        """Deliveries matching ``selection``, newest (highest id) first; ``before`` is the
        keyset cursor (ids below it), ``upto_id`` an upper bound kept by a bulk action."""

    @abc.abstractmethod
    async def count_deliveries(
        self, selection: DeliveryFilter = DeliveryFilter(), *, upto_id: int | None = None,
        cap: int | None = None,
    ) -> tuple[int, int]:
        """How many deliveries match ``selection`` (up to ``upto_id``), and the highest id
        among them (0 when none): the count a bulk action confirms and the bound it keeps.
        With ``cap``, counting stops past it (``cap + 1`` means "more than ``cap``": the
        messages browser's count, cheap at a million rows), and the highest id is exact only
        when the count is within ``cap`` (a bulk action counts without one)."""

    @abc.abstractmethod
    async def cancel_many(self, ids: Sequence[int], reason: str, by: str) -> set[int]:
        """Cancel these deliveries where they are still pending (never ambiguous: that is
        ``resolve``'s), in one transaction, one ``cancelled`` event each naming who; returns
        the ids cancelled. Rows another transaction holds at that moment (a claim) are
        skipped, never waited for."""

    @abc.abstractmethod
    async def dead_letter(self, delivery_id: int) -> DeadLetter | None: ...

    @abc.abstractmethod
    async def list_dead_letters(
        self, selection: DeadLetterFilter = DeadLetterFilter(), limit: int = 100
    ) -> list[DeadLetter]:
        """Dead letters matching ``selection``, oldest first."""

    @abc.abstractmethod
    async def replay_dead_letters(self, ids: Sequence[int], by: str) -> set[int]:
        """Send these dead deliveries again: same row, same key, same rendered content, a fresh
        attempt budget. Guarded: only entries whose delivery is still dead or expired and that
        are not discarded. Marks each entry replayed (when, by whom, how often)."""

    @abc.abstractmethod
    async def discard_dead_letter(self, delivery_id: int, reason: str, by: str) -> bool:
        """Close an open entry without sending; it stays for the record until retention."""

    @abc.abstractmethod
    async def cancel(self, delivery_id: int, reason: str = "") -> bool:
        """Withdraw a pending (or ambiguous) delivery; False when it is past that."""

    @abc.abstractmethod
    async def discard_dead_letters(self, ids: Sequence[int], reason: str,
                                   by: str) -> set[int]:
        """``discard_dead_letter`` for many entries in one transaction; returns the ids
        discarded (open entries whose delivery is still dead or expired)."""

    @abc.abstractmethod
    async def set_state_if_ambiguous_many(self, transitions: Sequence[Transition]) -> set[int]:
        """``postlane resolve``: the operator settles an ambiguous delivery by hand, through
        the same guarded operation as the worker's reconciler (``WorkerStore``)."""

    @abc.abstractmethod
    async def prune(self, finished_before: timedelta, dead_before: timedelta) -> int:
        """Delete finished deliveries (and their timeline) older than the given ages."""

    @abc.abstractmethod
    async def suppress(self, address: str, stream: str, reason: str,
                       delivery_id: int | None = None, *, source_event: str | None = None,
                       expires_in: timedelta | None = None) -> bool:
        """Add an address to the suppression list for ``stream`` (a lane, or ``*``), until
        removed or for ``expires_in``. An entry already there is replaced only by one that
        ends later (an expired one by any); False when nothing was written."""

    @abc.abstractmethod
    async def unsuppress(self, address: str, stream: str | None = None) -> int:
        """Lift a suppression (every stream when ``stream`` is None); returns rows removed."""

    @abc.abstractmethod
    async def list_suppressions(self, address: str | None = None,
                                limit: int = 100) -> list[Suppression]: ...

    @abc.abstractmethod
    async def sms_fallback_pair(self, delivery_id: int) -> FallbackPair | None:
        """The fallback pair ``delivery_id`` belongs to, as the email or as the SMS."""

    @abc.abstractmethod
    async def requeue_suppressed(self, address: str) -> list[int]:
        """After a suppression was lifted: send the deliveries it stopped (same key)."""


class TemplateStore(Protocol):
    """Template versions, and enqueues rendered from one (checked and locked against delete
    and deprecate in the same transaction). Used by ``postlane.templates``, the CLI's
    ``templates`` commands, the API's template routes and ``postlane.imports``."""

    limits: Limits

    @abc.abstractmethod
    async def add_template_version(
        self, name: str, subject: str, text: str | None, html: str | None
    ) -> TemplateVersion:
        """Store the next version of template ``name`` (version 1 creates it). Versions are
        immutable; a name deleted earlier continues its numbering, never reuses it."""

    @abc.abstractmethod
    async def get_template(self, name: str, version: int | None = None) -> TemplateVersion | None:
        """One version of ``name`` (default: the latest); None if unknown or deleted."""

    @abc.abstractmethod
    async def list_templates(self) -> list[TemplateVersion]:
        """The latest version of every template that is not deleted, by name."""

    @abc.abstractmethod
    async def set_template_deprecated(self, name: str, deprecated: bool = True) -> bool:
        """Stop (or allow again) new enqueues from ``name``; False if it does not exist."""

    @abc.abstractmethod
    async def count_template_references(self, name: str) -> int:
        """Deliveries of ``name`` that may still be sent (pending, sending, ambiguous) or
        replayed (dead or expired with an open dead letter)."""

    @abc.abstractmethod
    async def delete_template_if_unreferenced(self, name: str) -> TemplateDeletion:
        """Delete every version of ``name`` unless deliveries still reference it (counted as
        in ``count_template_references``, under a lock that keeps enqueues out meanwhile)."""

    @abc.abstractmethod
    async def enqueue_many_if_template_usable(
        self, template: str, messages: Sequence[Message],
        progress: ImportProgress | None = None, *, validated: bool = False,
        producer: str | None = None,
    ) -> list[EnqueueResult]:
        """``enqueue_many`` of messages rendered from ``template``, in one transaction that
        first checks (and locks against delete and deprecate) that the template exists and is
        not deprecated; raises ``UnknownTemplate`` or ``TemplateDeprecated`` otherwise.

        With ``progress``, the import's counters are written in the same transaction:
        read, enqueued and skipped as given; created grows by the rows this call created.
        ``validated``: the caller already ran ``validate`` on each message with this store's
        limits (the import does, to skip bad rows), so it is not run twice.
        ``producer``: who writes (None: the application; ``import:<id>`` for an import);
        a key held by another producer or for other content raises ``KeyConflict``.
        """


class ImportStore(Protocol):
    """The record of bulk-import runs and what became of their deliveries. Used by
    ``postlane.imports`` (with ``TemplateStore``: an import renders a template), the CLI's
    ``import`` commands, the API's import routes and the dashboard."""

    @abc.abstractmethod
    async def start_import(
        self, import_id: str, template: str, template_version: int, file_name: str, lane: str
    ) -> ImportRecord | None:
        """Record a run of an import (a first run, a re-run or a resume): counters reset,
        ``runs`` + 1. None when ``import_id`` already belongs to another template."""

    @abc.abstractmethod
    async def finish_import(self, progress: ImportProgress) -> None:
        """Write the run's final counters (created as counted so far) and its end time."""

    @abc.abstractmethod
    async def get_import(self, import_id: str) -> ImportRecord | None: ...

    @abc.abstractmethod
    async def list_imports(self, limit: int = 100) -> list[ImportRecord]:
        """Imports, most recently started first."""

    @abc.abstractmethod
    async def start_import_canary(
        self, import_id: str, size: int, keys: Sequence[str]
    ) -> ImportCanary:
        """Record an import's canary (its first deliveries' keys) unless it has one; returns
        the canary as recorded (the first run's, on a re-run)."""

    @abc.abstractmethod
    async def get_import_canary(self, import_id: str) -> ImportCanary | None:
        """The canary with its deliveries counted by state and the held ones counted."""

    @abc.abstractmethod
    async def release_import_hold(self, import_id: str) -> int:
        """Make the deliveries held behind the canary due now, and mark a waiting or failed
        canary ``released``; returns how many were released."""

    @abc.abstractmethod
    async def import_counts(self, import_id: str) -> ImportCounts:
        """What became of an import's deliveries, for the operator's four questions."""


class ApiKeyStore(Protocol):
    """The HTTP API's keys, kept as hashes. Used by ``api.keys`` (authentication), the CLI's
    ``apikey`` commands and the dashboard's sign-in."""

    @abc.abstractmethod
    async def create_api_key(
        self, name: str, prefix: str, token_hash: str, scopes: Sequence[str]
    ) -> ApiKey:
        """Store a new key; only the hash of its token is kept."""

    @abc.abstractmethod
    async def get_api_key(
        self, *, key_id: int | None = None, token_hash: str | None = None
    ) -> ApiKey | None:
        """A key by id or by the hash of its token, revoked or not."""

    @abc.abstractmethod
    async def list_api_keys(self) -> list[ApiKey]:
        """Every key, revoked ones included, oldest first."""

    @abc.abstractmethod
    async def revoke_api_key(self, key_id: int) -> bool:
        """Revoke an active key; False when no active key has that id."""

    @abc.abstractmethod
    async def end_api_key_sessions(self, key_id: int, before: float) -> bool:
        """End the dashboard sessions of a key issued before ``before`` (unix seconds):
        signing out. False when no key has that id."""


class ProviderEventStore(Protocol):
    """Delivery events a provider reports (delivered, bounced, complained...) by webhook,
    DSN or one-click unsubscribe, each processed once. Used by ``postlane.webhooks`` and
    ``postlane.unsubscribe`` only."""

    @abc.abstractmethod
    async def record_provider_event(
        self, event: ProviderEvent, policy: SuppressionPolicy = DEFAULT_POLICY,
    ) -> ProviderEventResult:
        """Process a provider event once: attach it to its delivery (see ``ProviderEvent``
        for how it is found) in the timeline, move the provider status only forward, and
        suppress the address as ``core.deliverability.suppression_for`` says (counting the
        address's recent soft bounces under ``policy``), all in one transaction."""


class CallbackStore(Protocol):
    """Status callbacks to the application: its endpoints, and the outbox the timeline's
    trigger fills. Used by ``postlane.callbacks`` (the sender), the CLI's ``callbacks``
    commands and the HTTP API."""

    @abc.abstractmethod
    async def add_callback_endpoint(self, url: str, secret: str, api_key_id: int | None,
                                    events: Sequence[str]) -> CallbackEndpoint:
        """Register an endpoint; ``events`` empty: every event type."""

    @abc.abstractmethod
    async def list_callback_endpoints(self, api_key_id: int | None = None,
                                      *, every_key: bool = True) -> list[CallbackEndpoint]:
        """Endpoints, disabled ones included, oldest first; with ``every_key`` False only
        those of ``api_key_id`` (None: the global ones)."""

    @abc.abstractmethod
    async def disable_callback_endpoint(self, endpoint_id: int,
                                        api_key_id: int | None = None) -> bool:
        """Stop callbacks to an endpoint (those queued are dropped as they come due). With
        ``api_key_id``, only an endpoint of that key. False when none matched."""

    @abc.abstractmethod
    async def claim_callbacks(self, limit: int, lease_s: float) -> list[Callback]:
        """Take due callbacks of active endpoints for one attempt each: their ``run_at`` moves
        a lease ahead and their attempt is counted, so a sender that dies leaves them due
        again (at least once)."""

    @abc.abstractmethod
    async def finish_callbacks(self, results: Sequence[CallbackResult]) -> int:
        """Apply what came of claimed callbacks, each guarded by its attempt count; a callback
        that is sent or dead also writes a timeline event of its delivery. How many applied."""

    @abc.abstractmethod
    async def list_callbacks(self, state: str | None = None, delivery_id: int | None = None,
                             limit: int = 100) -> list[Callback]:
        """Callbacks, newest first, optionally of one state or delivery."""

    @abc.abstractmethod
    async def replay_callbacks(self, ids: Sequence[int] | None = None) -> int:
        """Dead callbacks (these ids, or all) due again with a fresh budget; how many."""

    @abc.abstractmethod
    async def callback_counts(self) -> dict[str, int]:
        """Callbacks by state, for metrics and the health of the receivers."""
