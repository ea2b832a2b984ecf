"""``postlane templates ...``: add versions, list, show, deprecate, delete (when unreferenced)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from postlane.cli.shell import console, run_with_store, table, when
from postlane.core.records import TemplateVersion
from postlane.errors import UnknownTemplate
from postlane.store.base import Store
from postlane.templates import add_template, delete_template, deprecate_template

templates = typer.Typer(
    help="Versioned templates: a message is rendered once, at enqueue; editing adds a version.",
    no_args_is_help=True, rich_markup_mode=None,
)


def template_json(template: TemplateVersion, references: int | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": template.name, "version": template.version,
        "latest_version": template.latest_version, "deprecated": template.deprecated,
        "subject": template.subject, "text": template.text, "html": template.html,
        "created_at": template.created_at.isoformat(),
    }
    if references is not None:
        data["references"] = references
    return data


@templates.command("add")
def add(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Template name; an existing name gets a new "
                                             "version.")],
    subject: Annotated[str, typer.Option(help="Subject (Jinja2).")],
    text: Annotated[str | None, typer.Option(help="Plain-text body (Jinja2).")] = None,
    html: Annotated[str | None, typer.Option(help="HTML body (Jinja2, autoescaped).")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Add a template, or a new version of one (queued messages keep their rendering)."""

    async def _add(store: Store) -> TemplateVersion:
        return await add_template(store, name, subject=subject, text=text, html=html)

    version = run_with_store(ctx, _add)
    if as_json:
        print(json.dumps(template_json(version)))
    else:
        console.print(f"template {version.name} version {version.version}"
                      + (" (deprecated: takes no new enqueues)" if version.deprecated else ""))


@templates.command("list")
def list_(ctx: typer.Context, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Every template with its latest version."""

    async def _list(store: Store) -> list[TemplateVersion]:
        return await store.list_templates()

    found = run_with_store(ctx, _list)
    if as_json:
        print(json.dumps([template_json(t) for t in found]))
        return
    if not found:
        console.print("no templates")
        return
    grid = table("name", "version", "subject", "updated (UTC)", keep=("name",))
    for t in found:
        grid.add_row(t.name, f"{t.version}, deprecated" if t.deprecated else str(t.version),
                     t.subject, when(t.created_at))
    console.print(grid, markup=False, highlight=False)


@templates.command("show")
def show(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Template name.")],
    version: Annotated[int | None, typer.Option(help="A version (default: the latest).")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """One version's texts, and how many deliveries still reference the template."""

    async def _show(store: Store) -> tuple[TemplateVersion, int]:
        found = await store.get_template(name, version)
        if found is None:
            which = f"{name!r} version {version}" if version is not None else repr(name)
            raise UnknownTemplate(f"unknown template {which}")
        return found, await store.count_template_references(name)

    template, references = run_with_store(ctx, _show)
    if as_json:
        print(json.dumps(template_json(template, references)))
        return
    console.print(f"[bold]{template.name}[/bold] version {template.version} of "
                  f"{template.latest_version}" + ("  [yellow]deprecated[/yellow]"
                                                  if template.deprecated else ""))
    console.print(f"referenced by {references} queued or dead-lettered deliveries")
    for part in ("subject", "text", "html"):
        value = getattr(template, part)
        if value is not None:
            console.print(f"[dim]-- {part}[/dim]")
            console.print(value, markup=False, highlight=False)


@templates.command("deprecate")
def deprecate(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Template name.")],
    undo: Annotated[bool, typer.Option("--undo", help="Allow new enqueues again.")] = False,
) -> None:
    """Refuse new enqueues from NAME; messages already queued from it still send."""

    async def _deprecate(store: Store) -> None:
        await deprecate_template(store, name, not undo)

    run_with_store(ctx, _deprecate)
    console.print(f"template {name} " + ("takes new enqueues again" if undo
                                         else "deprecated: new enqueues are refused"))


@templates.command("delete")
def delete(ctx: typer.Context,
           name: Annotated[str, typer.Argument(help="Template name.")]) -> None:
    """Delete NAME and its versions; refused while deliveries may still send or replay it."""

    async def _delete(store: Store) -> None:
        await delete_template(store, name)

    run_with_store(ctx, _delete)
    console.print(f"template {name} deleted")
