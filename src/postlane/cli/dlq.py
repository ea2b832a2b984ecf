"""``postlane dlq ...`` and ``postlane timeline``: triage and act on what did not go out."""

from __future__ import annotations

import getpass
import json
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import typer
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from postlane.cli.durations import duration_option
from postlane.cli.shell import console, delivery_json, ids, run_with_store, table, when
from postlane.core.attachments import Attachment
from postlane.core.message import Delivery
from postlane.core.records import DeadLetter, DeadLetterFilter, Event
from postlane.core.redaction import redact_address, redact_addresses
from postlane.dead_letters import ReplayPlan, replay_one, replay_selection
from postlane.store.base import Store

dlq = typer.Typer(help="Dead letters: list, show, replay (staged), discard.",
                  no_args_is_help=True, rich_markup_mode=None)

Reason = Annotated[str | None, typer.Option(help="Only this reason (permanent, "
                                                 "budget_exhausted, expired, handler_error).")]
Cause = Annotated[str | None, typer.Option(help="Only this cause (unknown_template, "
                                               "account_or_configuration, handler_error, "
                                               "rejected_recipient, rejected_content, ...).")]
Lane = Annotated[str | None, typer.Option(help="Only this lane.")]
Template = Annotated[str | None, typer.Option("--template", help="Only this template id.")]
Import = Annotated[str | None, typer.Option("--import", help="Only this import id.")]
Since = Annotated[timedelta | None,
                  duration_option(help="Only dead-lettered within this long, e.g. 2h.")]


def _selection(reason: str | None, lane: str | None, template: str | None,
               import_id: str | None, since: timedelta | None,
               **extra: Any) -> DeadLetterFilter:
    since_at = datetime.now(UTC) - since if since is not None else None
    return DeadLetterFilter(reason=reason, lane=lane, template_id=template,
                            import_id=import_id, since=since_at, **extra)


def entry_json(entry: DeadLetter) -> dict[str, Any]:
    return {
        "delivery_id": entry.delivery_id, "reason": entry.reason, "cause": entry.cause,
        "key": entry.snapshot.get("idempotency_key"), "lane": entry.snapshot.get("lane"),
        "template_id": entry.snapshot.get("template_id"),
        "dead_at": entry.dead_at.isoformat(), "last_response": entry.last_response,
        "replay_count": entry.replay_count, "state": entry.delivery_state,
        "discarded_at": entry.discarded_at.isoformat() if entry.discarded_at else None,
    }


@dlq.command("list")
def list_(ctx: typer.Context, reason: Reason = None, lane: Lane = None,
          template: Template = None, import_id: Import = None, since: Since = None,
          cause: Cause = None,
          all_: Annotated[bool, typer.Option("--all", help="Include discarded and "
                                             "replayed-and-sent entries.")] = False,
          limit: int = 100,
          as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Open dead letters, oldest first, with counts per reason."""
    selection = _selection(reason, lane, template, import_id, since, include_closed=all_,
                           cause=cause)

    async def _list(store: Store) -> list[DeadLetter]:
        return await store.list_dead_letters(selection, limit=limit)

    entries = run_with_store(ctx, _list)
    if as_json:
        print(json.dumps([entry_json(e) for e in entries]))
        return
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry.reason] = counts.get(entry.reason, 0) + 1
    grid = table("id", "reason", "dead at (UTC)", "key / details",
                 title=f"dead letters ({len(entries)})", right=("id",), keep=("id", "reason"))
    for e in entries:
        details = Text(str(e.snapshot.get("idempotency_key")))
        details.append(f"\n{e.snapshot.get('lane')}, "
                       f"{redact_address(str(e.snapshot.get('recipient', '')))}, "
                       f"{e.replay_count} replays", style="dim")
        if e.last_response:
            details.append("\n" + _short(redact_addresses(e.last_response)), style="dim")
        grid.add_row(str(e.delivery_id), e.reason,
                     e.dead_at.astimezone(UTC).strftime("%Y-%m-%d\n%H:%M:%S"), details)
    console.print(grid)
    console.print("by reason: " + ("  ".join(f"{k}={v}" for k, v in sorted(counts.items()))
                                   or "none"))


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dlq.command()
def show(ctx: typer.Context, delivery_id: int,
         as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Everything an entry keeps: snapshot, reason, verbatim response, attempt history."""

    async def _show(store: Store) -> tuple[DeadLetter | None, tuple[Attachment, ...]]:
        parts = (await store.attachments_among([delivery_id])).get(delivery_id, ())
        return await store.dead_letter(delivery_id), parts

    entry, parts = run_with_store(ctx, _show)
    if entry is None:
        console.print(f"no dead letter for delivery {delivery_id}")
        raise typer.Exit(1)
    data = {**entry_json(entry), "snapshot": entry.snapshot,
            "attempt_history": entry.attempt_history, "replayed_by": entry.replayed_by,
            "discard_reason": entry.discard_reason,
            "attachments": [part.describe() for part in parts]}
    if as_json:
        print(json.dumps(data, default=str))
    else:
        _print_entry(entry, parts)


def _print_entry(entry: DeadLetter, parts: tuple[Attachment, ...] = ()) -> None:
    """``dlq show`` for a person: what it was, why it died, what was tried, what was done."""
    snap = entry.snapshot
    state = f"open ({entry.delivery_state})" if entry.discarded_at is None else "discarded"
    fields: list[tuple[str, object]] = [
        ("reason", entry.reason), ("cause", entry.cause), ("dead at", when(entry.dead_at)),
        ("entry", state),
        ("key", snap.get("idempotency_key")), ("lane", snap.get("lane")),
        ("to", redact_address(str(snap.get("recipient", "")))),
        ("subject", snap.get("subject")),
        ("template", f"{snap.get('template_id')} v{snap.get('template_version')}"
         if snap.get("template_id") else None),
        ("import", snap.get("import_id")), ("created", snap.get("created_at")),
        ("expires", snap.get("expires_at")), ("attempts", snap.get("attempts")),
        ("attachments", ", ".join(f"{p.filename} ({p.content_type}, {p.size:,} bytes)"
                                  for p in parts) or None),
        ("replays", entry.replay_count), ("replayed by", entry.replayed_by),
        ("discarded", f"{when(entry.discarded_at)}: {entry.discard_reason}"
         if entry.discarded_at else None),
    ]
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("dead letter", f"delivery {entry.delivery_id}")
    for name, value in fields:
        if value not in (None, ""):
            grid.add_row(name, str(value))
    console.print(grid, markup=False, highlight=False)
    console.print("last response", style="bold")
    console.print(Padding(Text(redact_addresses(entry.last_response or "(none)")), (0, 0, 0, 2)))
    console.print(f"attempt history ({len(entry.attempt_history)})", style="bold")
    for attempt in entry.attempt_history:
        at = attempt.get("at", "")
        rest = "  ".join(f"{k}={v}" for k, v in attempt.items() if k not in ("at", "traceback"))
        console.print(Padding(Text(f"{at}  {redact_addresses(rest)}"), (0, 0, 0, 2)))
    console.print("(recipient and content in full: postlane dlq show --json)", style="dim")


@dlq.command()
def replay(
    ctx: typer.Context,
    delivery_id: Annotated[int | None, typer.Argument(
        help="Replay this one entry (the canary). Without it: the rest of the selection.")
    ] = None,
    reason: Reason = None, lane: Lane = None, template: Template = None,
    import_id: Import = None, since: Since = None,
    valid_for: Annotated[timedelta | None, duration_option(
        help="Refuse entries created longer ago than this (e.g. 15m for resets).")] = None,
    dry_run: Annotated[bool, typer.Option(help="Show what would be replayed.")] = False,
    by: Annotated[str, typer.Option(help="Who replays (kept on the entry).")] = "",
) -> None:
    """Staged replay: one entry first; the rest of a selection once that one was sent."""
    who = by or getpass.getuser()
    if delivery_id is not None:
        async def _one(store: Store) -> DeadLetter:
            # A dry run refuses exactly as the replay would (discarded, not dead, no longer
            # useful), so it can be trusted before the real one.
            return await replay_one(store, delivery_id, by=who, valid_for=valid_for,
                                    dry_run=dry_run)

        entry = run_with_store(ctx, _one)
        verb = "would replay" if dry_run else "replayed"
        console.print(f"{verb} delivery {entry.delivery_id} with its original key "
                      f"{entry.snapshot.get('idempotency_key')}; when it is sent, replay the "
                      "rest with `postlane dlq replay` and the same filters")
        return
    selection = _selection(reason, lane, template, import_id, since)

    async def _rest(store: Store) -> ReplayPlan:
        return await replay_selection(store, selection, by=who, dry_run=dry_run,
                                      valid_for=valid_for)

    plan = run_with_store(ctx, _rest)
    verb = "would replay" if plan.dry_run else "replayed"
    console.print(f"canary {plan.canary} was sent; {verb} {len(plan.replay)} entries: "
                  f"{ids(plan.replay)}")
    if plan.skipped_expired:
        console.print(f"skipped {len(plan.skipped_expired)} no longer useful (discard them): "
                      f"{ids(plan.skipped_expired)}")


@dlq.command()
def discard(ctx: typer.Context, delivery_id: int,
            reason: Annotated[str, typer.Option(help="Why it is not replayed.")],
            by: str = "") -> None:
    """Close an entry without sending it."""

    async def _discard(store: Store) -> bool:
        return await store.discard_dead_letter(delivery_id, reason, by or getpass.getuser())

    if not run_with_store(ctx, _discard):
        console.print(f"delivery {delivery_id} has no open dead letter")
        raise typer.Exit(1)
    console.print(f"discarded dead letter {delivery_id}: {reason}")


async def _pair_of(store: Store, delivery: Delivery) -> dict[str, Any] | None:
    """The SMS fallback pair ``delivery`` belongs to, with a line saying what the other
    half is and where it stands."""
    pair = await store.sms_fallback_pair(delivery.id)
    if pair is None:
        return None
    data: dict[str, Any] = {"email_id": pair.email_id, "sms_id": pair.sms_id,
                            "reason": pair.reason, "created_at": pair.created_at.isoformat()}
    if pair.sms_id is None:
        data["line"] = f"sms fallback: none sent (the policy does not fall back on {pair.reason})"
        return data
    other_id = pair.sms_id if delivery.id == pair.email_id else pair.email_id
    other = await store.get(other_id)
    state = str(other.state) if other is not None else "pruned"
    if delivery.id == pair.email_id:
        sms = other.metadata.get("sms", {}) if other is not None else {}
        data["line"] = (f"sms fallback ({pair.reason}): delivery {other_id} "
                        f"key={other.key if other else '?'} state={state} "
                        f"{sms.get('encoding', '?')} {sms.get('segments', '?')} segment(s)")
    else:
        data["line"] = (f"fallback of ({pair.reason}): delivery {other_id} "
                        f"key={other.key if other else '?'} state={state}")
    return data


def timeline(
    ctx: typer.Context,
    id_or_key: Annotated[str | None, typer.Argument(
        help="Delivery id or idempotency key.")] = None,
    recipient: Annotated[str | None, typer.Option(
        help="Every delivery to this address (newest first).")] = None,
    import_id: Annotated[str | None, typer.Option("--import", help="Every delivery of an import.")
                         ] = None,
    limit: Annotated[int, typer.Option(help="Most deliveries to show.")] = 20,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Every transition of a delivery, from enqueue to its last provider event."""
    if (id_or_key is None) == (recipient is None and import_id is None):
        raise typer.BadParameter("give an id or key, or --recipient / --import")

    async def _timelines(store: Store) -> list[tuple[Any, list[Event], dict[str, Any] | None]]:
        if id_or_key is not None:
            delivery = await store.get(id_or_key)
            if delivery is None and id_or_key.isdigit():
                delivery = await store.get(int(id_or_key))
            found = [delivery] if delivery is not None else []
        else:
            found = await store.find_deliveries(recipient=recipient, import_id=import_id,
                                                limit=limit)
        return [(d, await store.timeline(d.id), await _pair_of(store, d)) for d in found]

    timelines = run_with_store(ctx, _timelines)
    if not timelines:
        console.print("no matching delivery")
        raise typer.Exit(1)
    if as_json:
        print(json.dumps([{"delivery": delivery_json(d), "fallback": pair, "events": [
            {"at": e.at.isoformat(), "kind": e.kind, "state": e.state, "data": e.data}
            for e in events]} for d, events, pair in timelines]))
        return
    for delivery, events, pair in timelines:
        console.print(f"delivery {delivery.id} key={delivery.key} lane={delivery.lane} "
                      f"channel={delivery.channel} to={redact_address(delivery.recipient)} "
                      f"state={delivery.state} attempts={delivery.attempts}",
                      markup=False, highlight=False)
        if pair is not None:
            console.print(f"  {pair['line']}", markup=False, highlight=False)
        for e in events:
            data = " ".join(f"{k}={v}" for k, v in e.data.items() if k != "traceback")
            console.print(f"  {e.at.strftime('%H:%M:%S.%f')[:-3]}  {e.kind:<16} "
                          f"{e.state or '':<10} {data}", markup=False, highlight=False)
