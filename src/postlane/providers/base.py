"""The provider seam: one ``send`` and the capability flags the worker reads.

An adapter owns exactly one mapping: a rendered delivery plus its idempotency key into a
request, and the response (or its absence) into an ``Outcome``. It never raises for a
provider's answer; an exception out of ``send`` is a bug and dead-letters as
``handler_error``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from postlane.core.message import EMAIL, Delivery
from postlane.core.outcomes import Outcome
from postlane.errors import ConfigurationError, InvalidMessage, MissingSender

if TYPE_CHECKING:
    from postlane.limiter.auto import AccountLimits


@dataclass(frozen=True, slots=True)
class Capabilities:
    deduplicates_by_key: bool = False
    """A repeat with the same idempotency key returns the original result, sends nothing."""
    dedup_window: timedelta | None = None
    """How long the provider remembers a key; a retry past it is not protected."""
    can_lookup_by_key: bool = False
    """``lookup`` can tell whether a key was accepted, so ambiguity can be reconciled."""


class Provider(abc.ABC):
    """Base class of every adapter."""

    name: str = "provider"
    channel: str = EMAIL
    """What it sends (``email`` or ``sms``): its worker claims only deliveries of this channel."""
    capabilities: Capabilities = Capabilities()
    needs_sender: bool = False
    """A send needs a sender address: the message's own, else ``configured_sender()``."""

    def configured_sender(self) -> str | None:
        """The sender used for messages that name none (the URL's ``from=``)."""
        return None

    def endpoint(self) -> tuple[str, int] | None:
        """Host and port the adapter connects to, so ``postlane check`` can see that
        something answers there without sending; None for an in-process adapter."""
        return None

    @property
    def account(self) -> str:
        """The rate-limit and breaker scope: one ceiling per provider account."""
        return self.name

    @abc.abstractmethod
    async def send(self, delivery: Delivery) -> Outcome:
        """Send ``delivery`` with ``delivery.key`` as its idempotency key."""

    async def lookup(self, key: str) -> Outcome | None:
        """For reconciliation: ``accepted`` if the provider has ``key``, ``None`` if it
        does not know it. Only called when ``capabilities.can_lookup_by_key``."""
        raise NotImplementedError(f"{self.name} cannot look messages up by key")

    async def account_limits(self) -> AccountLimits:
        """The account's send limits as the provider reports them (``--rate auto``).

        Most providers have no such API: their limits are documented (docs/providers.md) and
        given with ``--rate``. Raises ``ConfigurationError`` saying so.
        """
        raise ConfigurationError(no_account_limits(self))

    async def open(self) -> None:
        """Acquire connections; called once by the worker before the first send."""
        return None

    async def close(self) -> None:
        """Release connections; called once when the worker stops."""
        return None


def reports_account_limits(provider: Provider) -> bool:
    """Whether ``provider`` can answer ``account_limits`` (checked before a worker starts)."""
    return type(provider).account_limits is not Provider.account_limits


def no_account_limits(provider: Provider) -> str:
    """Why ``--rate auto`` cannot work with ``provider``, and what to do instead."""
    return (f"--rate auto: the {provider.name} provider cannot report its account's limits; "
            "give them with --rate (e.g. 200/s, 50000/d or 14/s,50000/d; see "
            "docs/providers.md)")


def refused_before_sending(exc: InvalidMessage) -> Outcome:
    """A delivery the adapter could not turn into a request: the message's fault (permanent),
    except a missing sender, which is the deployment's (no ``from=`` on the provider): every
    message without a sender of its own would fail alike, so it is account-level."""
    if isinstance(exc, MissingSender):
        return Outcome.account(f"not sent: {exc}")
    return Outcome.permanent(f"refused before sending: {exc}")
