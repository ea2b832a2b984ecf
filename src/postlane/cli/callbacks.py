"""``postlane callbacks add|list|remove|log|replay``: status callbacks to the application."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from postlane.callbacks import register_endpoint
from postlane.cli.shell import console, run_with_store, table, when
from postlane.core.records import CALLBACK_TYPES, Callback, CallbackEndpoint
from postlane.core.redaction import redact_url
from postlane.errors import ConfigurationError
from postlane.store.base import Store

callbacks = typer.Typer(
    help="Status callbacks: signed events (Standard Webhooks) to the application for sent, "
         "dead-lettered, bounced, complained and suppressed deliveries.",
    no_args_is_help=True, rich_markup_mode=None)


def endpoint_json(endpoint: CallbackEndpoint) -> dict[str, Any]:
    return {"id": endpoint.id, "url": redact_url(endpoint.url), "api_key_id": endpoint.api_key_id,
            "events": list(endpoint.events) or ["*"],
            "created_at": endpoint.created_at.isoformat(),
            "disabled_at": endpoint.disabled_at.isoformat() if endpoint.disabled_at else None}


def callback_json(callback: Callback) -> dict[str, Any]:
    return {"id": callback.id, "webhook_id": callback.message_id, "type": callback.type,
            "delivery_id": callback.delivery_id, "endpoint_id": callback.endpoint_id,
            "state": callback.state, "attempts": callback.attempts,
            "last_error": callback.last_error, "created_at": callback.created_at.isoformat()}


@callbacks.command()
def add(
    ctx: typer.Context,
    url: Annotated[str, typer.Argument(help="The application's endpoint (http or https).")],
    api_key: Annotated[int | None, typer.Option(
        help="Only deliveries this API key produced (`apikey list`); default: every "
             "delivery.")] = None,
    events: Annotated[str, typer.Option(
        help=f"Comma-separated event types ({', '.join(CALLBACK_TYPES)}); default: all.")
    ] = "",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Register an endpoint and print its signing secret, once."""
    async def _add(store: Store) -> CallbackEndpoint:
        try:
            return await register_endpoint(
                store, url, events=[e.strip() for e in events.split(",") if e.strip()],
                api_key_id=api_key, keys=store)
        except ConfigurationError as exc:
            raise typer.BadParameter(str(exc)) from None

    endpoint = run_with_store(ctx, _add)
    if as_json:
        print(json.dumps({**endpoint_json(endpoint), "secret": endpoint.secret}))
        return
    console.print(f"callback endpoint {endpoint.id} registered for "
                  f"{'API key ' + str(api_key) if api_key is not None else 'every delivery'}; "
                  "its signing secret is shown only this once:")
    print(endpoint.secret)


@callbacks.command("list")
def list_(ctx: typer.Context,
          as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Every endpoint (secrets are not shown)."""
    async def _list(store: Store) -> list[CallbackEndpoint]:
        return await store.list_callback_endpoints()

    endpoints = run_with_store(ctx, _list)
    if as_json:
        print(json.dumps([endpoint_json(e) for e in endpoints]))
        return
    grid = table("id", "url", "api key", "events", "created (UTC)", "disabled (UTC)",
                 title=f"callback endpoints ({len(endpoints)})", right=("id",))
    for e in endpoints:
        grid.add_row(str(e.id), redact_url(e.url),
                     str(e.api_key_id) if e.api_key_id is not None else "all",
                     ",".join(e.events) or "*", when(e.created_at),
                     when(e.disabled_at) if e.disabled_at else "")
    console.print(grid, markup=False, highlight=False)


@callbacks.command()
def remove(ctx: typer.Context,
           endpoint_id: Annotated[int, typer.Argument(help="The endpoint's id.")]) -> None:
    """Stop callbacks to an endpoint; those still queued for it become dead."""
    async def _remove(store: Store) -> bool:
        return await store.disable_callback_endpoint(endpoint_id)

    if not run_with_store(ctx, _remove):
        console.print(f"no active callback endpoint with id {endpoint_id}")
        raise typer.Exit(1)
    console.print(f"callback endpoint {endpoint_id} disabled")


@callbacks.command()
def log(
    ctx: typer.Context,
    state: Annotated[str | None, typer.Option(help="pending, sent or dead.")] = None,
    delivery: Annotated[int | None, typer.Option(help="Of this delivery only.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 50,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Callbacks, newest first: what was sent, what waits, what is dead and why."""
    if state not in (None, "pending", "sent", "dead"):
        raise typer.BadParameter("must be pending, sent or dead", param_hint="--state")

    async def _log(store: Store) -> list[Callback]:
        return await store.list_callbacks(state, delivery, limit)

    rows = run_with_store(ctx, _log)
    if as_json:
        print(json.dumps([callback_json(c) for c in rows]))
        return
    grid = table("id", "webhook-id", "type", "delivery", "state", "attempts", "last error",
                 title=f"callbacks ({len(rows)})", right=("id", "delivery", "attempts"))
    for c in rows:
        grid.add_row(str(c.id), c.message_id, c.type, str(c.delivery_id), c.state,
                     str(c.attempts), c.last_error or "")
    console.print(grid, markup=False, highlight=False)


@callbacks.command()
def replay(
    ctx: typer.Context,
    ids: Annotated[list[int] | None, typer.Argument(help="Dead callbacks to send again.")] = None,
    all_dead: Annotated[bool, typer.Option("--all", help="Every dead callback.")] = False,
) -> None:
    """Send dead callbacks again, with a fresh budget and the same webhook-id."""
    if bool(ids) == all_dead:
        raise typer.BadParameter("give callback ids or --all (not both)")

    async def _replay(store: Store) -> int:
        return await store.replay_callbacks(None if all_dead else ids)

    count = run_with_store(ctx, _replay)
    console.print(f"{count} dead callback{'s' if count != 1 else ''} queued again")
