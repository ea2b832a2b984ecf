"""Options that ``postlane worker`` and ``postlane check`` both read: one name, environment
variable and help text each, so the check is asked exactly what the worker will be given.

Each is the keyword arguments of a ``typer.Option``; the command adds its own parser where
it has one (the worker refuses a malformed ``--retry-base`` at once, the check reports it as
a finding) and its own default.
"""

from __future__ import annotations

from typing import Any


def _option(envvar: str, help: str) -> dict[str, Any]:
    return {"envvar": envvar, "show_envvar": True, "help": help}


PROVIDER = _option(
    "POSTLANE_PROVIDER",
    "Provider URL: noop://, record:///path.db, sandbox://, smtp://...; for SMS "
    "sandbox-sms:// or twilio://. A worker claims only its provider's channel. "
    "Secrets belong in the environment, not on the command line.")
RATE = _option(
    "POSTLANE_RATE",
    "The provider account's ceiling: 200/s; a daily quota 50000/d; both "
    "14/s,50000/d; or auto (read from the account, SES only, refreshed every "
    "5 minutes). Unset: no limit.")
HEADROOM = _option("POSTLANE_HEADROOM",
                   "Fraction kept below the ceiling for jitter at the provider.")
LIMITER = _option(
    "POSTLANE_LIMITER",
    "redis://host:6379/0 to share the ceiling across processes and hosts; "
    "default: in-process.")
CONCURRENCY = _option(
    "POSTLANE_CONCURRENCY",
    "Sends in flight at once, shared by the lanes (twice the batch size keeps "
    "the next claim going while a batch is sent).")
LANES = _option("POSTLANE_LANES", "Lane shares in percent [default: interactive=70,bulk=30].")
BULK_LANES = _option(
    "POSTLANE_BULK_LANES",
    "Lanes of mail people subscribed to (comma-separated; '' for none): their "
    "messages carry one-click List-Unsubscribe headers, transactional lanes never "
    "[default: bulk].")
UNSUBSCRIBE_URL = _option(
    "POSTLANE_UNSUBSCRIBE_URL",
    "Public https base URL of `postlane serve` for one-click unsubscribe links "
    "(…/unsubscribe/TOKEN); tokens are signed with $POSTLANE_UNSUBSCRIBE_SECRET. "
    "Unset: bulk mail goes without the headers.")
UNSUBSCRIBE_MAILTO = _option(
    "POSTLANE_UNSUBSCRIBE_MAILTO",
    "Address for the mailto form of List-Unsubscribe (read by `postlane bounces "
    "maildir` or the smtp webhook).")
RETRY_BASE = _option(
    "POSTLANE_RETRY_BASE",
    "Backoff base per lane, e.g. interactive=250ms,bulk=1s: the first retry comes "
    "within twice the base, each further one waits up to twice as long "
    "[default: interactive 250ms, bulk 1s].")
RETRY_CAP = _option(
    "POSTLANE_RETRY_CAP",
    "Longest backoff per lane, e.g. interactive=30s,bulk=5m "
    "[default: interactive 30s, bulk 5m].")
RETRY_BUDGET = _option(
    "POSTLANE_RETRY_BUDGET",
    "Fraction of a message's validity window (enqueue to expiry) its retries may "
    "use, per lane (interactive=0.5,bulk=0.8) or one for every lane; a retry that "
    "would start later is not made: dead-lettered as budget_exhausted "
    "[default: 0.667].")
