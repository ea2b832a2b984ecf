"""SMS fallback: when an email that someone is waiting for does not arrive, say it by SMS.

Pure; no I/O. An email carries its fallback in ``metadata["sms_fallback"]`` (the phone
number and text it would send, and optionally when), written in the same transaction as the
email itself by every enqueue path (``with_sms_fallback`` builds it). Its lane's
``FallbackPolicy`` says when a fallback fires unless the message says otherwise:

    dead      the email was dead-lettered (permanent refusal, retry budget spent...)
    expired   the email's validity window ended before it was sent
    unsent    the email is still not sent ``after`` its enqueue (pending, sending, or
              ambiguous: nobody knows that it arrived)

The fallback is a delivery of its own (``channel="sms"``, key ``sms-fallback:<email key>``,
its own attempts and validity window), with the segment count and encoding recorded in its
metadata before it is sent (``core.sms.sms_message``). The worker's housekeeping finds due
fallbacks and creates them (``worker.housekeeping``); the derived key makes that idempotent
across a fleet.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from postlane.core.durations import parse_duration
from postlane.core.message import Delivery, Message
from postlane.core.sms import DEFAULT_MAX_SEGMENTS, fallback_key, sms_message
from postlane.core.states import State
from postlane.errors import ConfigurationError, InvalidMessage

METADATA_KEY = "sms_fallback"
TRIGGERS = ("dead", "expired", "unsent")
DEFAULT_TRIGGERS: frozenset[str] = frozenset({"dead", "expired", "unsent"})

_TRIGGER_OF_STATE = {State.DEAD: "dead", State.EXPIRED: "expired", State.PENDING: "unsent",
                     State.SENDING: "unsent", State.AMBIGUOUS: "unsent"}
CANDIDATE_STATES = tuple(str(s) for s in _TRIGGER_OF_STATE)
"""Email states in which a fallback may be due; the others (sent, cancelled, suppressed)
never call for one."""


@dataclass(frozen=True, slots=True)
class FallbackPolicy:
    """A lane's default: which triggers fire, and how long an email may stay unsent."""

    on: frozenset[str] = DEFAULT_TRIGGERS
    after_s: float | None = None
    """``unsent`` fires this long after enqueue; None: never (only dead and expired)."""


DEFAULT_FALLBACK = FallbackPolicy()
"""Dead and expired fall back; unsent only where a lane or the message sets a time."""


@dataclass(frozen=True, slots=True)
class FallbackSpec:
    """One email's fallback, as ``metadata["sms_fallback"]`` holds it."""

    to: str
    text: str
    on: frozenset[str] | None = None
    """Overrides the lane's triggers."""
    after_s: float | None = None
    """Overrides the lane's ``after_s``."""
    valid_for_s: float | None = None
    """The SMS's own validity window; None: its lane's default, counted from its creation."""
    lane: str | None = None
    """The SMS's lane; None: the email's."""

    def as_metadata(self) -> dict[str, Any]:
        data: dict[str, Any] = {"to": self.to, "text": self.text}
        if self.on is not None:
            data["on"] = sorted(self.on)
        for name in ("after_s", "valid_for_s", "lane"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        return data


def parse_triggers(value: object, *, field: str = "sms_fallback.on") -> frozenset[str]:
    """``["dead", "unsent"]`` or ``"dead,unsent"`` -> triggers; anything else is refused."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple | frozenset | set):
        raise InvalidMessage(f"{field} must be a list of {', '.join(TRIGGERS)}", field=field)
    names = [str(i).strip() for i in items]
    unknown = sorted({n for n in names if n not in TRIGGERS})
    if unknown:
        raise InvalidMessage(f"{field}: unknown trigger(s) {', '.join(unknown)} "
                             f"(known: {', '.join(TRIGGERS)})", field=field)
    return frozenset(names)


def _seconds(value: object, field: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value > 0):
        raise InvalidMessage(f"{field} must be a positive number of seconds", field=field)
    return float(value)


def parse_spec(value: object) -> FallbackSpec:
    """``metadata["sms_fallback"]`` as a ``FallbackSpec``; ``InvalidMessage`` names the
    field that is wrong (the phone number and length are checked by ``validate``)."""
    if not isinstance(value, Mapping):
        raise InvalidMessage("metadata.sms_fallback must be an object with to and text",
                             field="metadata.sms_fallback")
    unknown = sorted(set(value) - {"to", "text", "on", "after_s", "valid_for_s", "lane"})
    if unknown:
        raise InvalidMessage(f"metadata.sms_fallback: unknown field(s) {', '.join(unknown)}",
                             field="metadata.sms_fallback")
    to, text, lane = value.get("to"), value.get("text"), value.get("lane")
    if not isinstance(to, str) or not to:
        raise InvalidMessage("sms_fallback.to: a phone number is needed",
                             field="sms_fallback.to")
    if not isinstance(text, str) or not text:
        raise InvalidMessage("sms_fallback.text: a text is needed", field="sms_fallback.text")
    if lane is not None and not isinstance(lane, str):
        raise InvalidMessage("sms_fallback.lane must be a lane name", field="sms_fallback.lane")
    on = value.get("on")
    return FallbackSpec(
        to=to, text=text, on=None if on is None else parse_triggers(on), lane=lane,
        after_s=_seconds(value.get("after_s"), "sms_fallback.after_s"),
        valid_for_s=_seconds(value.get("valid_for_s"), "sms_fallback.valid_for_s"),
    )


def spec_of(metadata: Mapping[str, Any]) -> FallbackSpec | None:
    """The fallback an email carries, if any."""
    value = metadata.get(METADATA_KEY)
    return None if value is None else parse_spec(value)


def with_sms_fallback(
    message: Message, *, to: str, text: str, on: Iterable[str] | None = None,
    after: timedelta | None = None, valid_for: timedelta | None = None,
    lane: str | None = None,
) -> Message:
    """``message`` (an email) with an SMS fallback to ``to`` saying ``text``.

    ``on`` and ``after`` override the lane's policy (``after``: how long the email may stay
    unsent); ``valid_for`` is the SMS's own validity window. Checked again by ``validate``
    at enqueue: a bad phone number or a text over the segment limit stores nothing.
    """
    spec = FallbackSpec(
        to=to, text=text, on=None if on is None else parse_triggers(list(on)),
        after_s=None if after is None else after.total_seconds(),
        valid_for_s=None if valid_for is None else valid_for.total_seconds(), lane=lane)
    parse_spec(spec.as_metadata())  # the same checks as a hand-written one
    return replace(message, metadata={**dict(message.metadata), METADATA_KEY: spec.as_metadata()})


def due(delivery: Delivery, spec: FallbackSpec, lane: FallbackPolicy,
        now: datetime) -> str | None:
    """Which trigger fires for ``delivery`` now (``dead``, ``expired``, ``unsent``), or None."""
    trigger = _TRIGGER_OF_STATE.get(delivery.state)
    if trigger is None:
        return None
    on = spec.on if spec.on is not None else lane.on
    if trigger not in on:
        return None
    if trigger != "unsent":
        return trigger
    after_s = spec.after_s if spec.after_s is not None else lane.after_s
    if after_s is None or now < delivery.created_at + timedelta(seconds=after_s):
        return None
    return trigger


def final(delivery: Delivery, spec: FallbackSpec, lane: FallbackPolicy) -> bool:
    """Whether no fallback can ever fire for ``delivery`` as it stands (dead or expired and
    the policy does not fall back on that): the sweep records it and stops looking."""
    trigger = _TRIGGER_OF_STATE.get(delivery.state)
    on = spec.on if spec.on is not None else lane.on
    return trigger in ("dead", "expired") and trigger not in on


def fallback_message(email: Delivery, spec: FallbackSpec, reason: str,
                     max_segments: int = DEFAULT_MAX_SEGMENTS) -> Message:
    """The SMS delivery of a fallback: its own key, lane, budget and validity window, with
    its segments and encoding recorded (``metadata["sms"]``) before it is ever sent."""
    return sms_message(
        key=fallback_key(email.key), to=spec.to, text=spec.text, lane=spec.lane or email.lane,
        metadata={"fallback_of": email.key, "fallback_of_id": email.id,
                  "fallback_reason": reason},
        expires_in=None if spec.valid_for_s is None else timedelta(seconds=spec.valid_for_s),
        max_segments=max_segments,
    )


def parse_policy(text: str) -> FallbackPolicy:
    """``dead+expired`` / ``dead+expired+unsent@2m`` / ``none`` -> a lane's policy (the
    command line's ``--sms-fallback interactive=...``)."""
    text = text.strip()
    if text in ("", "none", "off"):
        return FallbackPolicy(on=frozenset(), after_s=None)
    on: set[str] = set()
    after_s: float | None = None
    for part in text.split("+"):
        name, _, after = part.strip().partition("@")
        if name not in TRIGGERS:
            raise ConfigurationError(f"--sms-fallback: unknown trigger {name!r} "
                                     f"(known: {', '.join(TRIGGERS)}, none)")
        on.add(name)
        if after:
            if name != "unsent":
                raise ConfigurationError("--sms-fallback: only unsent takes a time "
                                         "(unsent@2m)")
            try:
                after_s = parse_duration(after).total_seconds()
            except ValueError as exc:
                raise ConfigurationError(f"--sms-fallback: {exc}") from None
            if after_s <= 0:
                raise ConfigurationError("--sms-fallback: unsent@ needs a positive time")
    return FallbackPolicy(on=frozenset(on), after_s=after_s)
