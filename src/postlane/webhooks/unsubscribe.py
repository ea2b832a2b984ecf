"""The one-click unsubscribe (RFC 8058) as ``postlane serve`` answers it.

The token in the URL is the credential: no session, no API key. A POST with a token that
verifies records an ``unsubscribed`` event on the delivery that carried the link and
suppresses the address for that stream (the lane), in one transaction; a second POST (mail
clients retry, people click twice) changes nothing and answers the same. A GET only shows
the page with the button: mail scanners follow links, so nothing changes on a GET.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from postlane.core.deliverability import source_of, unsubscribe_event
from postlane.core.unsubscribe import InvalidToken, TokenClaims, verify
from postlane.store.roles import ProviderEventStore

__all__ = ["InvalidToken", "UnsubscribeResult", "UnsubscribeStore", "claims_of", "one_click"]


class UnsubscribeStore(ProviderEventStore, Protocol):
    """Recording the event, and making sure the suppression is there on a repeat (an
    operator may have lifted it since the first click)."""

    @abc.abstractmethod
    async def suppress(self, address: str, stream: str, reason: str,
                       delivery_id: int | None = None, *, source_event: str | None = None,
                       expires_in: timedelta | None = None) -> bool: ...


@dataclass(frozen=True, slots=True)
class UnsubscribeResult:
    claims: TokenClaims
    first: bool
    """False when this recipient had already unsubscribed through this link."""


def claims_of(secrets: tuple[bytes, ...], token: str) -> TokenClaims:
    """Verify a token (raises ``InvalidToken``); what the GET page needs."""
    if not secrets:
        raise InvalidToken("one-click unsubscribe is not configured on this server")
    return verify(secrets, token)


async def one_click(store: UnsubscribeStore, secrets: tuple[bytes, ...],
                    token: str) -> UnsubscribeResult:
    """Unsubscribe the token's recipient from its stream; raises ``InvalidToken``."""
    claims = claims_of(secrets, token)
    event = unsubscribe_event(claims, via="one-click")
    result = await store.record_provider_event(event)
    if result.duplicate:
        await store.suppress(claims.address, claims.stream, "unsubscribed",
                             claims.delivery_id, source_event=source_of(event))
    return UnsubscribeResult(claims, not result.duplicate)
