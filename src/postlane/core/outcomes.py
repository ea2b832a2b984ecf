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

Transient or ambiguous is decided by the *phase* the attempt ended in: each adapter marks
its point of no return (SMTP: the final dot of DATA written; HTTP: the whole request
written) and only an attempt that passed it can be ambiguous. See ``Phase``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from postlane.core.fastinit import frozen_init


class Phase(StrEnum):
    """Where a send attempt was when it ended, in the order an attempt goes through them.

    Only ``RESPONSE`` is past the point of no return: before it the provider cannot have
    the message, so a failure or a deadline there is transient, never ambiguous.
    """

    QUEUED = "queued"
    """Waiting for a pooled connection, a pool slot or a client thread."""
    CONNECT = "connect"
    """Opening the connection: TCP, TLS from the start (smtps, https), SMTP's 220 greeting."""
    HELLO = "hello"
    """SMTP EHLO (or HELO)."""
    TLS = "tls"
    """SMTP STARTTLS, or the TLS handshake of an https connection."""
    AUTH = "auth"
    """SMTP AUTH."""
    ENVELOPE = "envelope"
    """SMTP MAIL FROM and RCPT TO."""
    DATA = "data"
    """SMTP DATA until the message's final dot is handed to the connection."""
    REQUEST = "request"
    """HTTP: connecting, writing the request line, headers and body (SES: also preparing and
    signing the call)."""
    RESPONSE = "response"
    """Past the point of no return: the final dot or the request's last bytes were handed to
    the connection; waiting for, or reading, the answer."""

    @property
    def may_have_reached_provider(self) -> bool:
        return self is Phase.RESPONSE


class OutcomeClass(StrEnum):
    ACCEPTED = "accepted"
    THROTTLED = "throttled"
    TRANSIENT = "transient"
    AMBIGUOUS = "ambiguous"
    PERMANENT = "permanent"
    ACCOUNT = "account"


@frozen_init
@dataclass(frozen=True, slots=True)
class Outcome:
    kind: OutcomeClass
    provider_message_id: str | None = None
    retry_after_s: float | None = None
    """The provider's own Retry-After, already turned into seconds from now."""
    response: str | None = None
    """The provider's response, verbatim (the store bounds it)."""
    phase: Phase | None = field(default=None, compare=False)
    """The phase the attempt ended in; None when the adapter does not report phases. Where,
    not what: two outcomes that differ only in it are the same answer."""

    cause: str | None = field(default=None, compare=False)
    """For a permanent refusal, the adapter's own ``DeadCause`` when it knows better than
    the classification of its response text (``postlane.core.causes``)."""

    def at(self, phase: Phase | None) -> Outcome:
        """This outcome, marked with ``phase`` unless the adapter already named one."""
        if self.phase is not None or phase is None:
            return self
        return replace(self, phase=phase)

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
                  retry_after_s: float | None = None, *, phase: Phase | None = None) -> Outcome:
        return cls(OutcomeClass.TRANSIENT, retry_after_s=retry_after_s, response=response,
                   phase=phase)

    @classmethod
    def ambiguous(cls, response: str | None = None, *, phase: Phase | None = None) -> Outcome:
        return cls(OutcomeClass.AMBIGUOUS, response=response, phase=phase)

    @classmethod
    def permanent(cls, response: str | None = None, *, cause: str | None = None) -> Outcome:
        return cls(OutcomeClass.PERMANENT, response=response, cause=cause)

    @classmethod
    def account(cls, response: str | None = None,
                retry_after_s: float | None = None) -> Outcome:
        return cls(OutcomeClass.ACCOUNT, retry_after_s=retry_after_s, response=response)
