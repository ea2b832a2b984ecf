"""``postlane bounces maildir``: bounces, complaints and mailto unsubscribes from a Maildir.

Point the bounce address (the envelope sender, ``Return-Path``) and the unsubscribe mailbox
of an SMTP provider at a mailbox delivered as a Maildir (Postfix, Dovecot, Exim all can),
and run this from cron or a timer. Each message not yet seen is parsed
(``webhooks.dsn``: RFC 3464 DSNs, RFC 5965 feedback reports, ``unsubscribe TOKEN``
subjects), its events recorded exactly once (as through the ``smtp`` webhook), and the
message marked seen (flag ``S``, moved to ``cur/``) or, with ``--delete``, removed. A
message that is none of these is left unseen for a person to read.
"""

from __future__ import annotations

import json
import mailbox
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from postlane.cli.shell import console, run_with_store
from postlane.core.deliverability import SuppressionPolicy
from postlane.core.unsubscribe import secrets_from_env
from postlane.errors import ConfigurationError
from postlane.store.base import Store
from postlane.webhooks import record_events
from postlane.webhooks.dsn import MAX_BYTES, parse_inbound

bounces = typer.Typer(help="Mail that comes back: DSN bounces, feedback-loop complaints, "
                           "mailto unsubscribes.", no_args_is_help=True, rich_markup_mode=None)


@dataclass
class MaildirRun:
    read: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    not_reports: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"read": self.read, "not_reports": self.not_reports, "events": self.events}


@bounces.command()
def maildir(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="The Maildir (with new/, cur/, tmp/).")],
    delete: Annotated[bool, typer.Option(
        help="Remove each processed message instead of marking it seen.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Record the bounces, complaints and unsubscribes waiting in a Maildir, once each."""
    if not (path / "new").is_dir() or not (path / "cur").is_dir():
        raise typer.BadParameter(f"{path} is not a Maildir (no new/ and cur/ in it)",
                                 param_hint="PATH")
    try:
        policy = SuppressionPolicy.from_env()
        secrets = secrets_from_env()
    except ConfigurationError as exc:
        raise typer.BadParameter(str(exc)) from None
    box = mailbox.Maildir(path, factory=None, create=False)

    async def _read(store: Store) -> MaildirRun:
        run = MaildirRun()
        for key in list(box.iterkeys()):
            message = box.get_message(key)
            if "S" in message.get_flags():
                continue
            raw = box.get_bytes(key)
            events = parse_inbound(raw, secrets) if len(raw) <= MAX_BYTES else []
            if not events:
                run.not_reports += 1
                continue
            run.read += 1
            result = await record_events(store, events, policy)
            run.events.extend(result.events)
            # Marked only after its events are stored: a crash in between reads it again,
            # and the events are recorded once each all the same.
            if delete:
                box.remove(key)
            else:
                message.set_subdir("cur")
                message.add_flag("S")
                box[key] = message
        return run

    run = run_with_store(ctx, _read)
    if as_json:
        print(json.dumps(run.as_json()))
        return
    kinds: dict[str, int] = {}
    for event in run.events:
        kinds[event["kind"]] = kinds.get(event["kind"], 0) + 1
    summary = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "no events"
    console.print(f"read {run.read} report(s): {summary}; "
                  f"{sum(1 for e in run.events if e['duplicate'])} already recorded, "
                  f"{sum(1 for e in run.events if e['suppressed'])} suppressing; "
                  f"{run.not_reports} other message(s) left unseen")
