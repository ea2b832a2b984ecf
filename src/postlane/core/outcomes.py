"""What a send attempt came to. Every provider adapter maps its own responses onto these.

The split follows what the worker can do next:

    accepted    the provider has it                         -> sent
    throttled   429 or a limiter denial: we were early      -> requeue, attempt not spent
    transient   5xx, refused/reset before the request left  -> retry with backoff
    ambiguous   timeout or drop *after* the request left    -> reconcile before a new attempt
    permanent   400/404/422, rejected address, no template  -> dead-letter now
    account     the provider account cannot send at all:    -> requeue, attempt not spent;
                bad credentials (SMTP 535, HTTP 401/403),      the breaker opens at once and
                an unverified sender identity, no sender       records why

``account`` is never the message's fault: the same request will succeed unchanged once an
operator fixes the account, so dead-lettering it (and, in one bad minute, the whole queue)
would turn a configuration slip into a replay campaign.

A 4xx that names a ``Retry-After`` is the provider saying *when*, not *never*: adapters map
it to ``throttled`` (and ``decide`` treats a ``permanent`` that carries one the same way).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class OutcomeClass(StrEnum):
    ACCEPTED = "accepted"
    THROTTLED = "throttled"
    TRANSIENT = "transient"
    AMBIGUOUS = "ambiguous"
    PERMANENT = "permanent"
    ACCOUNT = "account"


@dataclass(frozen=True, slots=True)
class Outcome:
    kind: OutcomeClass
    provider_message_id: str | None = None
    retry_after_s: float | None = None
    """The provider's own Retry-After, already turned into seconds from now."""
    response: str | None = None
    """The provider's response, verbatim (the store bounds it)."""

    @classmethod
    def accepted(cls, provider_message_id: str | None = None,
                 response: str | None = None) -> Outcome:
        return cls(OutcomeClass.ACCEPTED, provider_message_id=provider_message_id,
                   response=response)

    @classmethod
    def throttled(cls, retry_after_s: float | None = None,
                  response: str | None = None) -> Outcome:
        return cls(OutcomeClass.THROTTLED, retry_after_s=retry_after_s, response=response)

    @classmethod
    def transient(cls, response: str | None = None,
                  retry_after_s: float | None = None) -> Outcome:
        return cls(OutcomeClass.TRANSIENT, retry_after_s=retry_after_s, response=response)

    @classmethod
    def ambiguous(cls, response: str | None = None) -> Outcome:
        return cls(OutcomeClass.AMBIGUOUS, response=response)

    @classmethod
    def permanent(cls, response: str | None = None) -> Outcome:
        return cls(OutcomeClass.PERMANENT, response=response)

    @classmethod
    def account(cls, response: str | None = None,
                retry_after_s: float | None = None) -> Outcome:
        return cls(OutcomeClass.ACCOUNT, retry_after_s=retry_after_s, response=response)
