"""Why a dead letter is there, finely enough to route the alert: page or ticket.

The reason (``DeadReason``: ``permanent``, ``budget_exhausted``, ...) says what the worker
did; the cause says what an operator must fix, and so who must be woken. A 404 "template
missing after a deploy" and a 400 "bad address" are both ``permanent``: the first fails
every message of that template until someone redeploys (page), the second is one
customer's typo (ticket). The shipped alert rules route on ``ROUTES``.

=============================  ======  ===================================================
cause                          route   what it means, what to do
=============================  ======  ===================================================
``unknown_template``           page    the provider (or Postlane) does not know the
                                       template: a deploy removed or renamed it
``account_or_configuration``   page    the refusal names the sender, its domain or identity,
                                       the API key, the endpoint: every message like it
                                       will fail until the configuration is fixed
``handler_error``              page    an exception in the worker or adapter: a bug, or a
                                       stored row that cannot be read
``ambiguous_unresolved``       page    the provider may or may not have it; nobody could
                                       tell (a reconciler gave up, or an operator did)
``rejected_recipient``         ticket  the address was refused (no such mailbox or domain,
                                       invalid): one recipient's problem
``rejected_content``           ticket  the message was refused for what it carries (spam,
                                       policy, size)
``rejected_other``             ticket  a permanent refusal that names none of the above
``budget_exhausted``           ticket  transient failures until the attempts ran out
                                       (provider-wide trouble pages through the breaker)
``expired``                    ticket  the message outlived its usefulness: nothing to fix
                                       in it, but is its lane starved or paused?
=============================  ======  ===================================================

``cause_of`` names it from the reason and the provider's response (an adapter may name
it itself: ``Outcome.cause``); the classification of a refusal reads the SMTP enhanced
status code and the phase it came in, the HTTP status, and the words of the answer.
"""

from __future__ import annotations

import re
from enum import StrEnum

from postlane.core.states import DeadReason


class DeadCause(StrEnum):
    UNKNOWN_TEMPLATE = "unknown_template"
    ACCOUNT_OR_CONFIGURATION = "account_or_configuration"
    HANDLER_ERROR = "handler_error"
    AMBIGUOUS_UNRESOLVED = "ambiguous_unresolved"
    REJECTED_RECIPIENT = "rejected_recipient"
    REJECTED_CONTENT = "rejected_content"
    REJECTED_OTHER = "rejected_other"
    BUDGET_EXHAUSTED = "budget_exhausted"
    EXPIRED = "expired"


ROUTES: dict[DeadCause, str] = {
    DeadCause.UNKNOWN_TEMPLATE: "page",
    DeadCause.ACCOUNT_OR_CONFIGURATION: "page",
    DeadCause.HANDLER_ERROR: "page",
    DeadCause.AMBIGUOUS_UNRESOLVED: "page",
    DeadCause.REJECTED_RECIPIENT: "ticket",
    DeadCause.REJECTED_CONTENT: "ticket",
    DeadCause.REJECTED_OTHER: "ticket",
    DeadCause.BUDGET_EXHAUSTED: "ticket",
    DeadCause.EXPIRED: "ticket",
}
"""Who hears of a dead letter with this cause: ``page`` wakes someone, ``ticket`` waits for
working hours. ``alerts/postlane-rules.yml`` follows this."""

CAUSES_BY_REASON: dict[DeadReason, tuple[DeadCause, ...]] = {
    DeadReason.PERMANENT: (DeadCause.UNKNOWN_TEMPLATE, DeadCause.ACCOUNT_OR_CONFIGURATION,
                           DeadCause.REJECTED_RECIPIENT, DeadCause.REJECTED_CONTENT,
                           DeadCause.REJECTED_OTHER),
    DeadReason.BUDGET_EXHAUSTED: (DeadCause.BUDGET_EXHAUSTED,),
    DeadReason.HANDLER_ERROR: (DeadCause.HANDLER_ERROR,),
    DeadReason.EXPIRED: (DeadCause.EXPIRED,),
    DeadReason.AMBIGUOUS_UNRESOLVED: (DeadCause.AMBIGUOUS_UNRESOLVED,),
}
"""The causes each reason can have (the metrics create every pair at zero)."""

_BY_REASON: dict[str, DeadCause] = {
    DeadReason.HANDLER_ERROR: DeadCause.HANDLER_ERROR,
    DeadReason.BUDGET_EXHAUSTED: DeadCause.BUDGET_EXHAUSTED,
    DeadReason.EXPIRED: DeadCause.EXPIRED,
    DeadReason.AMBIGUOUS_UNRESOLVED: DeadCause.AMBIGUOUS_UNRESOLVED,
}


def cause_of(reason: str | None, response: str | None = None,
             named: str | None = None) -> DeadCause:
    """The cause of a dead letter with ``reason``: the adapter's own (``named``) when it
    gave one, else by reason, and for a permanent refusal by what the provider answered."""
    if named is not None:
        return DeadCause(named)
    if reason is not None and reason in _BY_REASON:
        return _BY_REASON[reason]
    return classify_refusal(response)


# The SMTP adapter keeps a refusal as "<command>: <code> <text>"; its text may carry an
# enhanced status code (RFC 3463): class.subject.detail.
_SMTP_REPLY = re.compile(r"^\s*(mail|rcpt|data)\s*:\s*[45]\d\d\b", re.I)
_ENHANCED = re.compile(r"\b[45]\.(\d{1,3})\.(\d{1,3})\b")
_HTTP_STATUS = re.compile(r"^\s*(?:[a-z_]+:\s*)?([45]\d\d)\b")
_TEMPLATE = re.compile(r"template", re.I)
_MISSING = re.compile(r"not found|does not exist|doesn't exist|unknown|missing|no such|"
                      r"invalid|\b404\b", re.I)
_CONFIGURATION = re.compile(
    r"\bsender\b|\bfrom (?:address|field|header)\b|['\"]from['\"]|not verified|unverified|"
    r"identity|"
    r"configuration set|api[ _-]?key|\btoken\b|credential|\baccount\b|dmarc|\bspf\b|dkim|"
    r"relay(?:ing)? (?:denied|not permitted|access denied)|not authori[sz]ed", re.I)
_RECIPIENT = re.compile(
    r"recipient|mailbox|address|['\"]to['\"]|no such user|user unknown|unknown user|"
    r"does not exist|bad destination|invalid (?:e-?mail|phone|number)|e\.164|smtputf8", re.I)
_CONTENT = re.compile(
    r"content|spam|\bbody\b|\bhtml\b|attachment|too large|size|virus|malware|"
    r"policy|blocked|message rejected|subject", re.I)


def classify_refusal(response: str | None) -> DeadCause:
    """The cause of a permanent refusal, from the provider's answer as the adapters keep it
    (``rcpt: 550 5.1.1 ...``, ``404 {"error": ...}``, ``MessageRejected: ...``, ``refused
    before sending: ...``). What names none of the causes is ``rejected_other``."""
    text = response or ""
    if _TEMPLATE.search(text) and _MISSING.search(text):
        return DeadCause.UNKNOWN_TEMPLATE
    smtp = _smtp_cause(text)
    if smtp is not None:
        return smtp
    status = _HTTP_STATUS.match(text)
    if status is not None and status[1] == "404":
        return DeadCause.ACCOUNT_OR_CONFIGURATION  # the endpoint or resource is wrong
    if status is not None and status[1] == "413":
        return DeadCause.REJECTED_CONTENT
    if _CONFIGURATION.search(text):
        return DeadCause.ACCOUNT_OR_CONFIGURATION
    if _RECIPIENT.search(text):
        return DeadCause.REJECTED_RECIPIENT
    if _CONTENT.search(text):
        return DeadCause.REJECTED_CONTENT
    return DeadCause.REJECTED_OTHER


def _smtp_cause(text: str) -> DeadCause | None:
    """By the enhanced status code, else by the command refused; None when not SMTP."""
    reply = _SMTP_REPLY.match(text)
    if reply is None:
        return None
    code = _ENHANCED.search(text)
    if code is not None:
        subject, detail = int(code[1]), int(code[2])
        if subject == 1:  # addressing: 5.1.7 and 5.1.8 are the sender's
            return (DeadCause.ACCOUNT_OR_CONFIGURATION if detail in (7, 8)
                    else DeadCause.REJECTED_RECIPIENT)
        if subject == 2:  # the mailbox: full, disabled; 5.2.3 is the message's size
            return DeadCause.REJECTED_CONTENT if detail == 3 else DeadCause.REJECTED_RECIPIENT
        if subject in (3, 6):  # the system's limits (5.3.4 too big), the content
            return DeadCause.REJECTED_CONTENT
        if subject == 7:  # security or policy: the sender's authentication, or the content
            if detail == 1 and _CONTENT.search(text) and not _CONFIGURATION.search(text):
                return DeadCause.REJECTED_CONTENT
            return DeadCause.ACCOUNT_OR_CONFIGURATION
    return {"rcpt": DeadCause.REJECTED_RECIPIENT, "mail": DeadCause.ACCOUNT_OR_CONFIGURATION,
            "data": DeadCause.REJECTED_CONTENT}[reply[1].lower()]


__all__ = ["CAUSES_BY_REASON", "ROUTES", "DeadCause", "cause_of", "classify_refusal"]
