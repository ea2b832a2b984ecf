"""``postlane apikey create|list|revoke``: keys for the HTTP API and the dashboard."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from postlane.api.keys import SCOPES, create_key
from postlane.cli.shell import console, run_with_store, table, when
from postlane.core.records import ApiKey
from postlane.errors import ConfigurationError
from postlane.store.base import Store

apikey = typer.Typer(help="API keys for the HTTP API and the dashboard (stored hashed).",
                     no_args_is_help=True, rich_markup_mode=None)


def _json(key: ApiKey) -> dict[str, object]:
    return {"id": key.id, "name": key.name, "prefix": key.prefix, "scopes": list(key.scopes),
            "created_at": key.created_at.isoformat(),
            "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None}


@apikey.command()
def create(
    ctx: typer.Context,
    scopes: Annotated[str, typer.Option(
        help=f"Comma-separated: {', '.join(SCOPES)} (send: POST /v1/messages; read: GETs and "
             "the dashboard; operate: replay, discard, pause).")],
    name: Annotated[str, typer.Option(help="Who or what uses it.")] = "",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Create a key and print its token, once: only its hash is stored."""
    async def _create(store: Store) -> tuple[ApiKey, str]:
        try:
            return await create_key(store, scopes, name)
        except ConfigurationError as exc:
            raise typer.BadParameter(str(exc), param_hint="--scopes") from None

    key, token = run_with_store(ctx, _create)
    if as_json:
        print(json.dumps({**_json(key), "token": token}))
        return
    console.print(f"created API key {key.id} ({key.name}) with scopes "
                  f"{','.join(key.scopes)}; the token is shown only this once:")
    print(token)


@apikey.command("list")
def list_(ctx: typer.Context,
          as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Every key (tokens are not stored, only their first characters)."""
    async def _list(store: Store) -> list[ApiKey]:
        return await store.list_api_keys()

    keys = run_with_store(ctx, _list)
    if as_json:
        print(json.dumps([_json(k) for k in keys]))
        return
    grid = table("id", "name", "prefix", "scopes", "created (UTC)", "revoked (UTC)",
                 title=f"API keys ({len(keys)})", right=("id",))
    for k in keys:
        grid.add_row(str(k.id), k.name, k.prefix + "…", ",".join(k.scopes), when(k.created_at),
                     when(k.revoked_at) if k.revoked_at else "")
    console.print(grid, markup=False, highlight=False)


@apikey.command()
def revoke(ctx: typer.Context,
           key_id: Annotated[int, typer.Argument(help="The key's id (`apikey list`).")]) -> None:
    """Revoke a key: requests and dashboard sessions using it are refused at once."""
    async def _revoke(store: Store) -> bool:
        return await store.revoke_api_key(key_id)

    if not run_with_store(ctx, _revoke):
        console.print(f"no active API key with id {key_id}")
        raise typer.Exit(1)
    console.print(f"revoked API key {key_id}")
