"""The pure halves of the second channel: when an email's SMS fallback fires
(``core.fallback``), what the SMS looks like, the lanes' policies as the command line gives
them, and when an import's canary is settled (``core.canary``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from postlane.core.canary import verdict
from postlane.core.fallback import (
    FallbackPolicy,
    FallbackSpec,
    due,
    fallback_message,
    final,
    parse_policy,
    parse_spec,
    spec_of,
    with_sms_fallback,
)
from postlane.core.lanes import DEFAULT_LANES, with_lane_policies
from postlane.core.message import Message
from postlane.core.states import State
from postlane.errors import ConfigurationError, InvalidMessage
from tests.factories import delivery

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SPEC = FallbackSpec(to="+14155550100", text="Your code is 1")
DEFAULT = FallbackPolicy()


def email(state: State, age_s: float = 10.0) -> object:
    return delivery("reset:1", state=state, created_at=NOW - timedelta(seconds=age_s))


@pytest.mark.parametrize(("state", "age_s", "policy", "spec", "fires"), [
    (State.DEAD, 1, DEFAULT, SPEC, "dead"),
    (State.EXPIRED, 1, DEFAULT, SPEC, "expired"),
    (State.SENT, 9999, FallbackPolicy(after_s=1), SPEC, None),
    (State.CANCELLED, 9999, FallbackPolicy(after_s=1), SPEC, None),
    (State.SUPPRESSED, 9999, FallbackPolicy(after_s=1), SPEC, None),
    (State.PENDING, 9999, DEFAULT, SPEC, None),  # no time set: never "unsent"
    (State.PENDING, 119, FallbackPolicy(after_s=120), SPEC, None),
    (State.PENDING, 121, FallbackPolicy(after_s=120), SPEC, "unsent"),
    (State.SENDING, 121, FallbackPolicy(after_s=120), SPEC, "unsent"),
    (State.AMBIGUOUS, 121, FallbackPolicy(after_s=120), SPEC, "unsent"),
    # The message's own time and triggers win over the lane's.
    (State.PENDING, 31, DEFAULT, FallbackSpec("+1", "t", after_s=30), "unsent"),
    (State.PENDING, 31, FallbackPolicy(after_s=10), FallbackSpec("+1", "t", after_s=60), None),
    (State.DEAD, 1, DEFAULT, FallbackSpec("+1", "t", on=frozenset({"unsent"})), None),
    (State.DEAD, 1, FallbackPolicy(on=frozenset()), SPEC, None),
    (State.DEAD, 1, FallbackPolicy(on=frozenset()), FallbackSpec("+1", "t",
                                                                 on=frozenset({"dead"})), "dead"),
])
def test_when_a_fallback_fires(state: State, age_s: float, policy: FallbackPolicy,
                               spec: FallbackSpec, fires: str | None) -> None:
    assert due(email(state, age_s), spec, policy, NOW) == fires  # type: ignore[arg-type]


def test_a_dead_email_its_policy_does_not_fall_back_on_is_final() -> None:
    no_dead = FallbackPolicy(on=frozenset({"unsent"}), after_s=60)
    assert final(email(State.DEAD), SPEC, no_dead)  # type: ignore[arg-type]
    assert not final(email(State.DEAD), SPEC, DEFAULT)  # type: ignore[arg-type]
    assert not final(email(State.PENDING), SPEC, no_dead)  # type: ignore[arg-type]


def test_the_sms_is_its_own_delivery_with_segments_recorded() -> None:
    e = delivery("reset:7", lane="interactive")
    spec = FallbackSpec(to="+14155550100", text="Код: 12345", valid_for_s=600.0, lane="bulk")
    sms = fallback_message(e, spec, "dead")
    assert (sms.key, sms.channel, sms.to, sms.lane) == ("sms-fallback:reset:7", "sms",
                                                        "+14155550100", "bulk")
    assert sms.metadata["sms"]["encoding"] == "UCS-2"
    assert sms.metadata["fallback_of"] == "reset:7"
    assert sms.metadata["fallback_reason"] == "dead"
    assert sms.expires_in == timedelta(minutes=10) and sms.expires_at is None
    # Without valid_for its lane's default applies from its own creation: no expiry given.
    plain = fallback_message(e, SPEC, "expired")
    assert plain.expires_at is None and plain.expires_in is None and plain.lane == "interactive"


def test_the_spec_round_trips_through_metadata_and_bad_ones_are_named() -> None:
    m = with_sms_fallback(Message(key="k", to="a@example.com", text="x"), to="+1415",
                          text="hi", on=["dead", "unsent"], after=timedelta(seconds=90))
    spec = spec_of(m.metadata)
    assert spec == FallbackSpec("+1415", "hi", on=frozenset({"dead", "unsent"}), after_s=90.0)
    assert spec_of({}) is None
    for bad, words in [
        ("x", "must be an object"),
        ({"to": "+1"}, "sms_fallback.text"),
        ({"text": "t"}, "sms_fallback.to"),
        ({"to": "+1", "text": "t", "after_s": -1}, "positive"),
        ({"to": "+1", "text": "t", "after_s": True}, "positive"),
        ({"to": "+1", "text": "t", "on": "dead,later"}, "unknown trigger"),
        ({"to": "+1", "text": "t", "colour": "red"}, "unknown field"),
    ]:
        with pytest.raises(InvalidMessage, match=words):
            parse_spec(bad)


@pytest.mark.parametrize(("text", "policy"), [
    ("dead+expired", FallbackPolicy(on=frozenset({"dead", "expired"}))),
    ("dead+unsent@2m", FallbackPolicy(on=frozenset({"dead", "unsent"}), after_s=120.0)),
    ("none", FallbackPolicy(on=frozenset())),
])
def test_a_lanes_policy_from_the_command_line(text: str, policy: FallbackPolicy) -> None:
    assert parse_policy(text) == policy


def test_lane_policies_apply_per_lane_and_refuse_nonsense() -> None:
    lanes = with_lane_policies(DEFAULT_LANES, retry_budget="interactive=0.5",
                               sms_fallback="interactive=dead+unsent@90s,bulk=none")
    interactive, bulk = lanes
    assert (interactive.retry_budget, bulk.retry_budget) == (0.5, 2 / 3)
    assert interactive.sms_fallback.after_s == 90.0 and bulk.sms_fallback.on == frozenset()
    assert with_lane_policies(DEFAULT_LANES, retry_budget="0.9")[1].retry_budget == 0.9
    for kwargs, words in [({"retry_budget": "interactive=2"}, "retry_budget"),
                          ({"retry_budget": "nope=0.5"}, "does not name"),
                          ({"retry_budget": "interactive=x"}, "not a number"),
                          ({"sms_fallback": "interactive=soon"}, "unknown trigger"),
                          ({"sms_fallback": "interactive=dead@2m"}, "only unsent")]:
        with pytest.raises(ConfigurationError, match=words):
            with_lane_policies(DEFAULT_LANES, **kwargs)


@pytest.mark.parametrize(("states", "settled"), [
    ({"pending": 3}, None),
    ({"sent": 2, "sending": 1}, None),
    ({"sent": 2, "ambiguous": 1}, None),
    ({"sent": 3}, (True, "canary passed: 3 of 3 sent")),
    ({"sent": 2, "suppressed": 1}, (True, "canary passed: 2 of 3 sent")),
    ({"sent": 1, "pending": 1, "dead": 1}, (False, "canary failed: k dead (permanent): 550")),
    ({"expired": 1, "pending": 2}, (False, "canary failed: k dead (permanent): 550")),
    ({}, None),
])
def test_when_a_canary_is_settled(states: dict[str, int],
                                  settled: tuple[bool, str] | None) -> None:
    assert verdict(states, "k dead (permanent): 550") == settled


def test_a_canary_that_sent_nothing_fails() -> None:
    result = verdict({"suppressed": 2, "cancelled": 1}, None)
    assert result is not None and result[0] is False
    assert "no canary delivery was sent" in result[1]


def test_email_providers_never_see_the_fallbacks_phone_number() -> None:
    from postlane.providers.http import generic_payload
    from postlane.providers.postmark import postmark_payload

    metadata = {"order": "8812", "sms_fallback": {"to": "+14155550100", "text": "code 1"}}
    d = delivery("reset:9", metadata=metadata)
    for payload in (generic_payload(d, None)["metadata"],
                    postmark_payload(d, None)["Metadata"]):
        assert payload["order"] == "8812" and "sms_fallback" not in payload
        assert "+14155550100" not in str(payload)
