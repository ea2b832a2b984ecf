"""The worker's second round of care: SMS fallbacks that fell due, and import canaries.

Run by the caretaker every ``rescue_interval_s`` on every worker, whatever its channel: the
decisions are pure (``core.fallback.due``, ``core.canary.verdict``) and the writes guarded
(``HousekeepingStore``), so a fleet doing it at once creates each fallback once and settles
each canary once.

Why a sweep and not the email's own transition: the fallback must also fire for an email
that is merely *still unsent* after a while, which no transition marks; expiries and dead
letters happen in several places (the acker, the rescuer, the reconciler, an operator); and
the transition path is the hottest SQL there is. The trigger is durable state (the email's
row and its ``metadata["sms_fallback"]``, written with it in the application's
transaction), so a crash between the email dying and the SMS being created only delays the
SMS to the next sweep, and the SMS's derived key (``sms-fallback:<key>``) plus the pair's
primary key make a second creation impossible.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime

from postlane.core import canary, fallback
from postlane.core.lanes import LaneConfig
from postlane.core.redaction import redact_address
from postlane.errors import InvalidMessage, KeyConflict
from postlane.store.roles import WorkerStore
from postlane.worker.controls import pause_import

log = logging.getLogger("postlane.worker")

BATCH = 100


class Housekeeping:
    def __init__(self, store: WorkerStore, lanes: Mapping[str, LaneConfig]) -> None:
        self.store = store
        self.lanes = lanes
        afters = [lane.sms_fallback.after_s for lane in lanes.values()
                  if lane.sms_fallback.after_s is not None]
        self.unsent_after_s = min(afters) if afters else None
        """The shortest ``unsent`` wait of any lane: what the candidate query may skip."""

    async def care(self) -> None:
        await self.fallbacks()
        await self.canaries()

    async def fallbacks(self) -> int:
        """Create the SMS fallbacks that fell due; how many were created."""
        created = 0
        now = datetime.now(UTC)
        for email in await self.store.list_fallback_candidates(self.unsent_after_s, BATCH):
            lane = self.lanes.get(email.lane)
            policy = lane.sms_fallback if lane is not None else fallback.FallbackPolicy()
            try:
                spec = fallback.spec_of(email.metadata)
            except InvalidMessage as exc:  # written by hand past validation
                log.error("delivery %d: unusable sms_fallback (%s); none will be sent",
                          email.id, exc)
                await self.store.create_sms_fallback(email.id, [str(email.state)], None,
                                                     _trigger(email.state))
                continue
            if spec is None:  # an unreadable row: nothing to send, stop looking at it
                await self.store.create_sms_fallback(email.id, [str(email.state)], None,
                                                     _trigger(email.state))
                continue
            if fallback.final(email, spec, policy):
                await self.store.create_sms_fallback(email.id, [str(email.state)], None,
                                                     _trigger(email.state))
                continue
            reason = fallback.due(email, spec, policy, now)
            if reason is None:
                continue
            try:
                message = fallback.fallback_message(email, spec, reason)
                pair = await self.store.create_sms_fallback(
                    email.id, [str(email.state)], message, reason)
            except (InvalidMessage, KeyConflict) as exc:
                log.error("delivery %d: its SMS fallback cannot be created (%s)", email.id, exc)
                await self.store.create_sms_fallback(email.id, [str(email.state)], None,
                                                     reason)
                continue
            if pair is not None and pair.sms_id is not None:
                created += 1
                log.info("delivery %d (%s) %s: SMS fallback %d to %s", email.id, email.key,
                         reason, pair.sms_id, redact_address(spec.to))
        return created

    async def canaries(self) -> int:
        """Settle the import canaries whose deliveries decided them; how many."""
        settled = 0
        for waiting in await self.store.list_waiting_canaries():
            verdict = canary.verdict(waiting.states, waiting.first_failure)
            if verdict is None:
                continue
            passed, reason = verdict
            if not await self.store.settle_import_canary(waiting.import_id, passed, reason):
                continue
            settled += 1
            if passed:
                log.info("import %s: %s; the rest is released", waiting.import_id, reason)
            else:
                await pause_import(self.store, waiting.import_id, by="canary", reason=reason)
                log.error("ALERT import %s paused: %s", waiting.import_id, reason)
        return settled


def _trigger(state: object) -> str:
    return "dead" if str(state) == "dead" else "expired" if str(state) == "expired" else "unsent"
