"""What a provider event does to the suppression list: the rules, without the storage.

- a hard bounce suppresses the address for every lane (``*``) until removed: the mailbox
  does not exist, and every further send to it counts against the sender's bounce rate;
- a complaint or an unsubscribe suppresses it for the lane (stream) it came through, until
  removed: the recipient still gets password resets, not the digest they reported;
- soft bounces suppress it for every lane *for a while*, once ``soft_bounce_threshold`` of
  them arrived within ``soft_bounce_window``: one full mailbox is no reason to stop, a
  mailbox full for a week is;
- everything else (delivered, deferred, rejected, opened, clicked) suppresses nothing.

The store counts the soft bounces and writes the entry in the transaction that records the
event (``ProviderEventStore.record_provider_event``).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from datetime import timedelta

from postlane.core.durations import parse_duration
from postlane.core.records import ProviderEvent
from postlane.core.unsubscribe import TokenClaims
from postlane.errors import ConfigurationError

EVERY_LANE = "*"
BOUNCE_RATE_LIMIT = 0.05
"""Above about 5 % hard bounces, providers review or pause a sending account."""
COMPLAINT_RATE_LIMIT = 0.001
"""Above about 0.1 % complaints, likewise (Google's bulk-sender rules: stay below 0.1 %,
never reach 0.3 %)."""
SOFT_BOUNCE_ENV = {
    "soft_bounce_threshold": "POSTLANE_SOFT_BOUNCE_THRESHOLD",
    "soft_bounce_window": "POSTLANE_SOFT_BOUNCE_WINDOW",
    "soft_bounce_suppress_for": "POSTLANE_SOFT_BOUNCE_SUPPRESS_FOR",
}


@dataclass(frozen=True, slots=True)
class SuppressionPolicy:
    soft_bounce_threshold: int = 3
    """Soft bounces of one address within the window that suppress it (0: never)."""
    soft_bounce_window: timedelta = timedelta(days=7)
    soft_bounce_suppress_for: timedelta = timedelta(days=7)
    """How long a run of soft bounces keeps the address suppressed."""

    def __post_init__(self) -> None:
        if self.soft_bounce_threshold < 0:
            raise ConfigurationError("the soft-bounce threshold cannot be negative")
        for name in ("soft_bounce_window", "soft_bounce_suppress_for"):
            if getattr(self, name) <= timedelta(0):
                raise ConfigurationError(f"{name.replace('_', ' ')} must be positive")

    @classmethod
    def from_env(cls) -> SuppressionPolicy:
        """``POSTLANE_SOFT_BOUNCE_THRESHOLD`` (3), ``POSTLANE_SOFT_BOUNCE_WINDOW`` (7d),
        ``POSTLANE_SOFT_BOUNCE_SUPPRESS_FOR`` (7d)."""
        default = cls()
        raw = {name: os.environ.get(env, "").strip() for name, env in SOFT_BOUNCE_ENV.items()}
        try:
            threshold = (int(raw["soft_bounce_threshold"]) if raw["soft_bounce_threshold"]
                         else default.soft_bounce_threshold)
        except ValueError:
            raise ConfigurationError(f"{SOFT_BOUNCE_ENV['soft_bounce_threshold']} is not a "
                                     f"whole number: {raw['soft_bounce_threshold']!r}") from None
        durations = {}
        for name in ("soft_bounce_window", "soft_bounce_suppress_for"):
            try:
                durations[name] = (parse_duration(raw[name]) if raw[name]
                                   else getattr(default, name))
            except ValueError as exc:
                raise ConfigurationError(f"{SOFT_BOUNCE_ENV[name]}: {exc}") from None
        return cls(threshold, **durations)


DEFAULT_POLICY = SuppressionPolicy()


@dataclass(frozen=True, slots=True)
class SuppressionRule:
    stream: str
    """A lane, or ``*`` for every lane."""
    reason: str
    expires_in: timedelta | None = None
    """None: until removed."""


def counts_soft_bounces(event: ProviderEvent) -> bool:
    """Whether the store must count this address's recent soft bounces for ``suppression_for``."""
    return event.kind == "soft_bounced"


def suppression_for(event: ProviderEvent, lane: str | None, *, soft_bounces: int = 0,
                    policy: SuppressionPolicy = DEFAULT_POLICY) -> SuppressionRule | None:
    """The suppression ``event`` makes for its address, if any. ``lane``: the stream the
    event concerns; ``soft_bounces``: soft bounces of the address within the policy's window,
    this one included."""
    if event.kind == "bounced":
        return SuppressionRule(EVERY_LANE, "hard bounce")
    if event.kind == "soft_bounced":
        if policy.soft_bounce_threshold and soft_bounces >= policy.soft_bounce_threshold:
            return SuppressionRule(EVERY_LANE, f"{soft_bounces} soft bounces",
                                   policy.soft_bounce_suppress_for)
        return None
    if lane is None:
        return None
    if event.kind == "complained":
        return SuppressionRule(lane, "complaint")
    if event.kind == "unsubscribed":
        return SuppressionRule(lane, "unsubscribed")
    return None


def source_of(event: ProviderEvent) -> str:
    """How a suppression names the event that made it."""
    return f"{event.provider}:{event.event_id}"


def unsubscribe_event(claims: TokenClaims, *, via: str) -> ProviderEvent:
    """The event a verified unsubscribe (one-click POST or mailto) records: one per
    recipient, stream and delivery, so a second click is a duplicate, not a second entry."""
    target = (str(claims.delivery_id) if claims.delivery_id is not None
              else hashlib.sha256(claims.address.encode("utf-8")).hexdigest()[:32])
    return ProviderEvent("postlane", f"unsubscribe:{claims.stream}:{target}", "unsubscribed",
                         None, claims.address, {"via": via}, delivery_id=claims.delivery_id,
                         lane=claims.stream)
