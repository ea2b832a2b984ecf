"""Provider events and the suppression list on SQLite."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import timedelta

from postlane.core.addresses import address_spellings, suppression_address
from postlane.core.deliverability import (
    DEFAULT_POLICY,
    SuppressionPolicy,
    counts_soft_bounces,
    source_of,
    suppression_for,
)
from postlane.core.message import Delivery
from postlane.core.records import (
    STATUS_RANK,
    LaneDeliverability,
    ProviderEvent,
    ProviderEventResult,
    Suppression,
    deliverability_from_rows,
)
from postlane.store.sqlite._base import Q, SQLiteEngine, _dt, _opt_dt


class ProviderEventsMixin(SQLiteEngine):
    # -- provider events and the suppression list -------------------------------------------
    def record_provider_event(
        self, event: ProviderEvent, policy: SuppressionPolicy = DEFAULT_POLICY,
    ) -> ProviderEventResult:
        with self._write() as conn:
            found = _event_delivery(conn, event)
            delivery_id = found[0] if found else None
            lane = event.lane or (found[1] if found else None)
            recipient = event.recipient or (found[2] if found else None)
            address = suppression_address(recipient) if recipient else None
            inserted = conn.execute(
                Q["insert_provider_event"],
                (event.provider, event.event_id, event.kind, event.provider_message_id,
                 delivery_id, address, lane),
            ).fetchone()
            if inserted is None:
                return ProviderEventResult(True, delivery_id, False)
            changed = False
            if found is not None:
                conn.execute(Q["insert_event"], (
                    delivery_id, f"provider:{event.kind}", None,
                    json.dumps({"provider": event.provider, "event_id": event.event_id,
                                **dict(event.data)}),
                ))
                current = conn.execute(Q["provider_status"], (delivery_id,)).fetchone()[0]
                changed = (STATUS_RANK.get(event.kind, -1)
                           > STATUS_RANK.get(current or "", -1))
                if changed:
                    conn.execute(Q["set_provider_status"], (event.kind, delivery_id))
            if address is None or (found is None and event.lane is None):
                return ProviderEventResult(False, delivery_id, changed)
            soft = 0
            if counts_soft_bounces(event):
                soft = int(conn.execute(
                    Q["recent_soft_bounces"],
                    (address, policy.soft_bounce_window.total_seconds()),
                ).fetchone()[0])
            rule = suppression_for(event, lane, soft_bounces=soft, policy=policy)
            if rule is None:
                return ProviderEventResult(False, delivery_id, changed)
            _upsert_suppression(conn, address, rule.stream, rule.reason, delivery_id,
                                source_of(event), rule.expires_in)
            return ProviderEventResult(False, delivery_id, changed, address)

    def suppress(self, address: str, stream: str, reason: str,
                       delivery_id: int | None = None, *, source_event: str | None = None,
                       expires_in: timedelta | None = None) -> bool:
        with self._write() as conn:
            return _upsert_suppression(conn, suppression_address(address), stream, reason,
                                       delivery_id, source_event, expires_in)

    def unsuppress(self, address: str, stream: str | None = None) -> int:
        with self._write() as conn:
            cur = conn.execute(
                Q["unsuppress"],
                (json.dumps(address_spellings(address)), stream, stream),
            )
            return cur.rowcount

    def list_suppressions(self, address: str | None = None,
                                limit: int = 100) -> list[Suppression]:
        key = json.dumps(address_spellings(address)) if address else None
        rows = self.conn.execute(
            Q["list_suppressions"], (key, key, limit),
        ).fetchall()
        return [Suppression(r[0], r[1], r[2], r[3], _dt(r[4]), r[5], _opt_dt(r[6]))
                for r in rows]

    def suppressed_among(self, deliveries: Sequence[Delivery]) -> dict[int, str]:
        if not deliveries:
            return {}
        batch = json.dumps([{"id": d.id, "address": a, "lane": d.lane}
                            for d in deliveries for a in address_spellings(d.recipient)])
        rows = self.conn.execute(Q["suppressed_among"], (batch,)).fetchall()
        return {int(r[0]): r[1] for r in rows}

    def requeue_suppressed(self, address: str) -> list[int]:
        with self._write() as conn:
            ids = [r[0] for r in conn.execute(
                Q["requeue_suppressed"],
                (json.dumps(address_spellings(address)),),
            ).fetchall()]
            conn.executemany(Q["insert_event"], [(i, "unsuppressed", "pending", "{}")
                                                 for i in ids])
        self.wake()
        return sorted(ids)

    def deliverability(self, window: timedelta) -> dict[str, LaneDeliverability]:
        seconds = window.total_seconds()
        sent = {lane: int(n) for lane, n in self.conn.execute(
            Q["sent_by_lane"], (seconds,)).fetchall()}
        events = self.conn.execute(Q["provider_events_by_lane"], (seconds,)).fetchall()
        return deliverability_from_rows(self.limits.lanes, sent, events)

    def provider_event_totals(self) -> dict[tuple[str, str], int]:
        return {(kind, lane): int(n) for kind, lane, n in self.conn.execute(
            Q["provider_event_totals"]).fetchall()}


def _event_delivery(conn: sqlite3.Connection,
                    event: ProviderEvent) -> tuple[int, str, str] | None:
    """(id, lane, recipient) of the delivery an event concerns: by id, provider message id,
    then idempotency key (see ``ProviderEvent``)."""
    lookups = (("event_delivery_by_id", event.delivery_id),
               ("event_delivery_by_provider_message_id", event.provider_message_id),
               ("event_delivery_by_key", event.idempotency_key))
    for name, value in lookups:
        if value is None:
            continue
        row = conn.execute(Q[name], (value,)).fetchone()
        if row is not None:
            return int(row[0]), str(row[1]), str(row[2])
    return None


def _upsert_suppression(conn: sqlite3.Connection, address: str, stream: str, reason: str,
                        delivery_id: int | None, source_event: str | None,
                        expires_in: timedelta | None) -> bool:
    """Add a suppression, or replace one that ends sooner (an expired one, or a soft-bounce
    entry that a hard bounce makes permanent); True when something was written."""
    seconds = None if expires_in is None else expires_in.total_seconds()
    row = conn.execute(
        Q["upsert_suppression"],
        (address, stream, reason, delivery_id, source_event, seconds),
    ).fetchone()
    return row is not None
