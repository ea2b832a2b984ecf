"""``manage.py postlane_migrate``: apply Postlane's migrations to the database ``send_mail``
writes into. A command and not a Django migration: Postlane versions its own schema (and a
Django migration, applied once, would never bring a later Postlane's migrations)."""

from __future__ import annotations

import asyncio
from typing import Any

from django.core.management.base import BaseCommand

from postlane.django.conf import store_url
from postlane.store import open_store


async def migrate(url: str) -> list[str]:
    async with open_store(url) as store:
        return await store.migrate()


class Command(BaseCommand):  # type: ignore[misc]
    help = "Apply Postlane's migrations (its tables) to POSTLANE['DATABASE']."

    def handle(self, *args: Any, **options: Any) -> None:
        applied = asyncio.run(migrate(store_url()))
        for label in applied:
            self.stdout.write(f"applied {label}")
        if not applied:
            self.stdout.write("Postlane's schema is up to date")
