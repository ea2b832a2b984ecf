"""The circuit breaker's I/O half: one shared record per provider account in the store.

Closed (no record): claims as usual; each worker watches its own recent outcomes and opens
the breaker for the whole fleet when failures look provider-wide. Open: nobody claims, so
messages wait in ``pending`` with their attempts untouched. After the cool-down one worker
wins a compare-and-set to ``half_open`` and sends one probe of a few deliveries: the first
accepted closes the breaker; all of them failing re-opens it with a doubled cool-down.

Account-level trouble (``OutcomeClass.ACCOUNT``: bad credentials, an unverified sender, no
sender) opens it on the first such answer, with the provider's words as the cause and an
``ALERT`` log line; the deliveries it touched went back to ``pending`` unspent (the policy),
and the probes go on as for any other opening until an operator has fixed the account.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from postlane.core.breaker import (
    CONTROL_PREFIX,
    BreakerConfig,
    BreakerRecord,
    FailureWindow,
    abandoned,
    account_trouble,
    opened,
    probing,
)
from postlane.core.message import Delivery
from postlane.core.outcomes import Outcome, OutcomeClass
from postlane.core.policy import Decision
from postlane.core.records import Control
from postlane.core.states import State
from postlane.store.roles import FleetStore

log = logging.getLogger("postlane.breaker")


class FleetBreaker:
    def __init__(self, store: FleetStore, account: str, owner: str, config: BreakerConfig,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.account = account
        self.name = CONTROL_PREFIX + account
        self.owner = owner
        self.config = config
        self.clock = clock
        self.window = FailureWindow(config)
        self.control: Control | None = None
        self._probe_token = False
        self._probe_ids: set[int] = set()
        self._last_account: Outcome | None = None
        """The account-level answer a probe met, for the re-opened record's cause."""

    @property
    def record(self) -> BreakerRecord | None:
        return BreakerRecord.from_json(self.control.value) if self.control else None

    @property
    def state(self) -> str:
        record = self.record
        return record.state if record else "closed"

    async def refresh(self, control: Control | None) -> None:
        self.control = control

    async def _reload(self) -> None:
        self.control = (await self.store.get_controls()).get(self.name)

    async def may_claim(self) -> tuple[bool, bool]:
        """(may claim, as the probe: claim exactly one)."""
        record = self.record
        if record is None:
            return True, False
        now = self.clock()
        if record.state == "open":
            if now < record.until:
                return False, False
            assert self.control is not None
            won = await self.store.compare_and_set_control(
                self.name, self.control.version,
                probing(record, now, self.owner, self.config).as_json(),
            )
            await self._reload()
            if won:
                log.warning("breaker %s half-open: %s sends one probe", self.name, self.owner)
                return True, True
            return False, False
        if record.probe_owner == self.owner and self._probe_token:
            self._probe_token = False
            return True, True
        if now > record.until and not self._probe_ids:
            # The prober vanished; re-open so that someone probes again at once.
            assert self.control is not None
            await self.store.compare_and_set_control(
                self.name, self.control.version,
                abandoned(record, now).as_json(),
            )
            await self._reload()
        return False, False

    def probe_claimed(self, batch: Sequence[Delivery]) -> None:
        if batch:
            self._probe_ids = {d.id for d in batch}
        else:
            self._probe_token = True  # this lane had nothing; let another lane probe

    def probe_unsent(self, delivery_id: int) -> None:
        """A delivery of the probe settled without a provider's answer (unreadable,
        expired, suppressed, or its adapter raised) says nothing about the provider; with
        none of the probe answered, this worker probes again, instead of waiting forever
        for an outcome that never comes."""
        if delivery_id in self._probe_ids:
            self._probe_ids.discard(delivery_id)
            if not self._probe_ids:
                self._probe_token = True

    async def observe(self, outcome: Outcome, decision: Decision,
                      delivery_id: int | None = None) -> None:
        account = outcome.kind is OutcomeClass.ACCOUNT
        failed = (account or outcome.kind in (OutcomeClass.TRANSIENT, OutcomeClass.AMBIGUOUS)
                  or decision.state is State.DEAD)
        now = self.clock()
        if delivery_id is not None and delivery_id in self._probe_ids:
            self._probe_ids.discard(delivery_id)
            if account:
                self._last_account = outcome
            if not failed:
                self._probe_ids.clear()  # the rest of the probe are stragglers now
                await self._probe_finished(now, failed=False)
            elif not self._probe_ids:  # every delivery of the probe failed
                await self._probe_finished(now, failed=True)
            return
        if self.control is not None:
            return  # already open or probing: outcomes of stragglers do not count
        if account:
            await self._open_for_account(now, outcome)
            return
        self.window.record(now, failed)
        if self.window.should_open(now):
            reason = f"{self.config.min_failures}+ failures within {self.config.window_s:g}s"
            if await self.store.compare_and_set_control(
                self.name, None, opened(now, self.config, reason).as_json()
            ):
                log.error("ALERT breaker %s opened: %s; claims stop", self.name, reason)
            self.window.clear()
            await self._reload()

    async def _probe_finished(self, now: float, failed: bool) -> None:
        await self._reload()
        record = self.record
        if record is None or self.control is None:
            return
        if failed:
            account, self._last_account = self._last_account, None
            reopened = (account_trouble(now, self.config, account.response,
                                        account.retry_after_s, record)
                        if account is not None else
                        opened(now, self.config, "probe failed", record))
            await self.store.compare_and_set_control(
                self.name, self.control.version, reopened.as_json())
            log.warning("breaker %s probe failed; open again for %.0fs", self.name,
                        min(self.config.max_cooldown_s, record.cooldown_s * 2))
        else:
            self._last_account = None
            await self.store.set_control(self.name, None)
            self.window.clear()
            log.warning("breaker %s closed: probe succeeded", self.name)
        await self._reload()

    async def _open_for_account(self, now: float, outcome: Outcome) -> None:
        """One account-level answer is enough: every send on the account would get it."""
        record = account_trouble(now, self.config, outcome.response, outcome.retry_after_s)
        if await self.store.compare_and_set_control(self.name, None, record.as_json()):
            log.error("ALERT breaker %s opened: %s; claims stop, deliveries wait in pending "
                      "with their attempts unspent until the account is fixed "
                      "(docs/runbook/provider-account-trouble.md)", self.name, record.reason)
        self.window.clear()
        await self._reload()
