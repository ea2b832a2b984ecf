"""``manage.py postlane_worker [worker options]``: ``postlane worker`` on the database
``send_mail`` writes into. The provider is ``--provider``, else ``POSTLANE["PROVIDER"]``,
else the ``POSTLANE_PROVIDER`` environment variable; every other option is
``postlane worker``'s (``manage.py postlane_worker --help``)."""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from postlane.django.conf import postlane_settings, store_url


class Command(BaseCommand):  # type: ignore[misc]
    help = "Run a Postlane worker on POSTLANE['DATABASE'] (options: postlane worker's)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("worker_args", nargs="*",
                            help="postlane worker's options, after --")

    def run_from_argv(self, argv: list[str]) -> None:
        # Everything after the command name goes to ``postlane worker`` untouched.
        self.handle(worker_args=argv[2:])

    def handle(self, *args: Any, worker_args: list[str], **options: Any) -> None:
        from postlane.cli.main import app

        conf = postlane_settings()
        argv = ["--db", store_url(conf), "worker", *worker_args]
        given = any(a == "--provider" or a.startswith("--provider=") for a in worker_args)
        if not given and conf.provider and "POSTLANE_PROVIDER" not in os.environ:
            argv += ["--provider", conf.provider]
        app(argv, prog_name="manage.py postlane_worker")
