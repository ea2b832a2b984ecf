"""``core.causes``: each dead letter's cause, row by row of the refusals adapters keep, and
the routing table the alert rules follow."""

from __future__ import annotations

import pytest

from postlane.core.causes import CAUSES_BY_REASON, ROUTES, DeadCause, cause_of, classify_refusal
from postlane.core.states import DeadReason

REFUSALS = [
    # SMTP: "<command>: <code> <text>", by enhanced status code, else by command
    ("rcpt: 550 5.1.1 <ada@example.com>: Recipient address rejected: User unknown",
     DeadCause.REJECTED_RECIPIENT),
    ("rcpt: 550 5.1.2 bad destination system address", DeadCause.REJECTED_RECIPIENT),
    ("rcpt: 552 5.2.2 mailbox full", DeadCause.REJECTED_RECIPIENT),
    ("rcpt: 550 No such user here", DeadCause.REJECTED_RECIPIENT),
    ("mail: 553 5.1.8 sender address domain does not exist",
     DeadCause.ACCOUNT_OR_CONFIGURATION),
    ("mail: 550 not allowed", DeadCause.ACCOUNT_OR_CONFIGURATION),
    ("rcpt: 554 5.7.1 Relay access denied", DeadCause.ACCOUNT_OR_CONFIGURATION),
    ("data: 550 5.7.26 unauthenticated mail is prohibited by DMARC policy",
     DeadCause.ACCOUNT_OR_CONFIGURATION),
    ("data: 554 5.7.1 message rejected as spam", DeadCause.REJECTED_CONTENT),
    ("data: 552 5.3.4 message size exceeds fixed limit", DeadCause.REJECTED_CONTENT),
    ("data: 554 5.6.0 malformed content", DeadCause.REJECTED_CONTENT),
    ("data: 554 transaction failed", DeadCause.REJECTED_CONTENT),
    # HTTP APIs: "<status> <body>"
    ('404 {"error": "unknown template welcome"}', DeadCause.UNKNOWN_TEMPLATE),
    ('422 {"message": "Template receipt-v2 does not exist"}', DeadCause.UNKNOWN_TEMPLATE),
    ('400 {"error": "recipient rejected: bob@example.com"}', DeadCause.REJECTED_RECIPIENT),
    ('422 {"message": "Invalid `to` field. The email address needs to follow ..."}',
     DeadCause.REJECTED_RECIPIENT),
    ('422 {"message": "The example.org domain is not verified"}',
     DeadCause.ACCOUNT_OR_CONFIGURATION),
    ('404 {"message": "Not Found"}', DeadCause.ACCOUNT_OR_CONFIGURATION),
    ('413 {"message": "payload too big"}', DeadCause.REJECTED_CONTENT),
    ('400 {"message": "attachment type not allowed"}', DeadCause.REJECTED_CONTENT),
    ('400 {"message": "something else"}', DeadCause.REJECTED_OTHER),
    # SES: "<Code>: <message>"
    ("MessageRejected: Email address is not verified. The following identities failed the "
     "check: ops@example.org", DeadCause.ACCOUNT_OR_CONFIGURATION),
    ("TemplateDoesNotExist: Template welcome does not exist", DeadCause.UNKNOWN_TEMPLATE),
    # Postlane's own refusals
    ("refused before sending: invalid address 'ada@'", DeadCause.REJECTED_RECIPIENT),
    (None, DeadCause.REJECTED_OTHER),
]


@pytest.mark.parametrize(("response", "cause"), REFUSALS)
def test_a_permanent_refusal_is_classified(response: str | None, cause: DeadCause) -> None:
    assert classify_refusal(response) is cause
    assert cause_of(DeadReason.PERMANENT, response) is cause


def test_the_other_reasons_name_their_cause_and_an_adapter_may_name_its_own() -> None:
    assert cause_of(DeadReason.HANDLER_ERROR, "rcpt: 550 5.1.1") is DeadCause.HANDLER_ERROR
    assert cause_of(DeadReason.EXPIRED) is DeadCause.EXPIRED
    assert cause_of(DeadReason.BUDGET_EXHAUSTED) is DeadCause.BUDGET_EXHAUSTED
    assert cause_of(DeadReason.AMBIGUOUS_UNRESOLVED) is DeadCause.AMBIGUOUS_UNRESOLVED
    assert cause_of(DeadReason.PERMANENT, "400 whatever",
                    "unknown_template") is DeadCause.UNKNOWN_TEMPLATE
    with pytest.raises(ValueError):
        cause_of(DeadReason.PERMANENT, None, "made_up")


def test_every_cause_is_routed_and_reachable_from_a_reason() -> None:
    assert set(ROUTES) == set(DeadCause)
    assert set(ROUTES.values()) <= {"page", "ticket"}
    assert {c for causes in CAUSES_BY_REASON.values() for c in causes} == set(DeadCause)
    assert set(CAUSES_BY_REASON) == set(DeadReason)
    # The two examples route apart.
    assert ROUTES[classify_refusal('404 {"error": "unknown template welcome"}')] == "page"
    assert ROUTES[classify_refusal('400 {"error": "recipient rejected: a@b.c"}')] == "ticket"


def test_decide_names_the_cause_of_a_permanent_refusal_and_the_transition_keeps_it() -> None:
    from datetime import UTC, datetime

    from postlane.core.lanes import DEFAULT_LANES
    from postlane.core.outcomes import Outcome
    from postlane.core.policy import decide
    from postlane.core.records import Transition
    from postlane.core.states import State
    from tests.factories import delivery

    lane = DEFAULT_LANES[0]
    now = datetime.now(UTC)
    refused = decide(delivery(), Outcome.permanent('404 {"error": "unknown template w"}'),
                     lane, now)
    assert refused.state is State.DEAD and refused.detail["cause"] == "unknown_template"
    named = decide(delivery(), Outcome.permanent("400 nope", cause="rejected_content"),
                   lane, now)
    assert named.detail["cause"] == "rejected_content"
    sent = decide(delivery(), Outcome.accepted("pm-1"), lane, now)
    assert "cause" not in sent.detail
    transition = Transition(1, 1, State.DEAD, "dead_lettered", error="rcpt: 550 5.1.1 no",
                            dead_reason="permanent", detail=refused.detail)
    assert transition.dead_cause == "unknown_template"  # the decision's, not re-read
    assert Transition(1, 1, State.DEAD, "dead_lettered", error="rcpt: 550 5.1.1 no",
                      dead_reason="permanent").dead_cause == "rejected_recipient"
    assert Transition(1, 1, State.SENT, "sent").dead_cause is None
