"""A Django project in one file, run as a subprocess by test_django.py (Django's settings are
process-global: each run gets a process of its own).

    python django_project.py ENGINE DATABASE scenario      # the scenario below, JSON out
    python django_project.py ENGINE DATABASE manage ARGS   # manage.py ARGS

ENGINE is ``sqlite`` (DATABASE a file), ``psycopg`` or ``psycopg2`` (DATABASE a URL; Django
picks psycopg 3 when it can import it, so the psycopg2 run hides it while Django loads).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any
from urllib.parse import urlsplit


def configure(engine: str, database: str) -> None:
    import django
    from django.conf import settings

    if engine == "sqlite":
        db: dict[str, Any] = {"ENGINE": "django.db.backends.sqlite3", "NAME": database}
    else:
        url = urlsplit(database)
        db = {"ENGINE": "django.db.backends.postgresql", "NAME": url.path.lstrip("/"),
              "USER": url.username or "", "PASSWORD": url.password or "",
              "HOST": url.hostname or "", "PORT": str(url.port or "")}
    if engine == "psycopg2":
        sys.modules["psycopg"] = None  # type: ignore[assignment]  # ImportError for Django
        import django.db.backends.postgresql.base  # binds psycopg2 now
        del sys.modules["psycopg"]
    settings.configure(
        DATABASES={"default": db},
        INSTALLED_APPS=["postlane.django"],
        EMAIL_BACKEND="postlane.django.EmailBackend",
        DEFAULT_FROM_EMAIL="Shop <shop@example.com>",
        POSTLANE={"LANE": "interactive"},
        USE_TZ=True,
    )
    django.setup()


class Rollback(Exception):
    pass


def welcome_bo() -> Any:
    """One business event's email, built the same way each time it is sent."""
    from django.core.mail import EmailMultiAlternatives

    email = EmailMultiAlternatives(
        "Welcome", "Hi Bo", to=["Bo <bo@example.com>"], cc=["cc@example.com"],
        bcc=["audit@example.com"], reply_to=["help@example.com"],
        headers={"Idempotency-Key": "welcome:2", "X-Campaign": "spring"})
    email.attach_alternative("<p>Hi Bo</p>", "text/html")
    email.postlane_lane = "bulk"
    return email


def scenario() -> dict[str, Any]:
    from django.core.mail import EmailMessage, send_mail, send_mass_mail
    from django.core.management import call_command
    from django.db import connection, transaction

    import postlane.django
    from postlane.django.conf import store_url
    from postlane.errors import InvalidMessage, KeyConflict
    from postlane.store import open_store

    seen: dict[str, Any] = {}
    out = __import__("io").StringIO()
    call_command("postlane_migrate", stdout=out)
    seen["migrate"] = out.getvalue()

    async def add_template() -> None:
        async with open_store(store_url()) as store:
            await store.add_template_version("receipt", "Receipt {{ n }}", "Paid {{ n }}", None)
    asyncio.run(add_template())

    with connection.cursor() as cur:
        cur.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, email TEXT)")
    seen["driver"] = type(connection.connection).__module__.split(".")[0]

    # 1. A business row and its email, rolled back together.
    try:
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("INSERT INTO accounts VALUES (1, 'ada@example.com')")
            EmailMessage("Welcome", "Hi Ada", to=["ada@example.com"],
                         headers={"Idempotency-Key": "welcome:1"}).send()
            raise Rollback
    except Rollback:
        pass
    seen["outbox_after_rollback"] = len(postlane.django.outbox)

    # 2. Committed together: one delivery per recipient, headers, HTML, lane.
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("INSERT INTO accounts VALUES (2, 'bo@example.com')")
        seen["sent_2"] = welcome_bo().send()
        seen["outbox_inside_atomic"] = len(postlane.django.outbox)
    seen["outbox_after_commit"] = len(postlane.django.outbox)
    # The same email (same keys, same content) again: nothing new. The same key for
    # another text is refused, and the transaction rolls back.
    with transaction.atomic():
        welcome_bo().send()
    try:
        with transaction.atomic():
            other = welcome_bo()
            other.body = "Hi Bo, something else"
            other.send()
    except KeyConflict as exc:
        seen["conflict"] = str(exc)

    # 3. Outside any atomic block: Django's autocommit, committed at once.
    seen["send_mail"] = send_mail("Hello", "No key given", None, ["cy@example.com"])
    seen["mass"] = send_mass_mail([("A", "a", None, ["d1@example.com"]),
                                   ("B", "b", None, ["d2@example.com"])])

    # 4. A refused email leaves the caller's transaction usable.
    with transaction.atomic():
        try:
            EmailMessage("File", "see attached", to=["ed@example.com"],
                         attachments=[("../a.txt", "x", "text/plain")]).send()
        except InvalidMessage as exc:
            seen["attachment_error"] = str(exc)
        with connection.cursor() as cur:
            cur.execute("INSERT INTO accounts VALUES (3, 'ed@example.com')")
    seen["fail_silently"] = send_mail("Bad", "x", None, ["nobody"], fail_silently=True)

    # 5. A template.
    with transaction.atomic():
        receipt = EmailMessage(to=["fay@example.com"])
        receipt.postlane_key = "receipt:9"  # type: ignore[attr-defined]
        receipt.postlane_template = "receipt"  # type: ignore[attr-defined]
        receipt.postlane_variables = {"n": 9}  # type: ignore[attr-defined]
        receipt.send()

    # 6. A misspelt setting is an error, not silently ignored.
    from django.test import override_settings

    from postlane.errors import ConfigurationError

    with override_settings(POSTLANE={"LAEN": "bulk"}):
        try:
            send_mail("Typo", "x", None, ["gus@example.com"])
        except ConfigurationError as exc:
            seen["typo"] = str(exc)

    seen["outbox"] = [[m.key, m.to, m.lane] for m in postlane.django.outbox]
    return seen


def attachments(directory: str) -> dict[str, Any]:
    """``attach``, ``attach_file``, an inline ``MIMEImage`` and a calendar alternative, in
    one ``EmailMultiAlternatives``: what the outbox stored, read back by the test."""
    from email.mime.image import MIMEImage
    from pathlib import Path

    from django.core.mail import EmailMultiAlternatives
    from django.core.management import call_command

    call_command("postlane_migrate", stdout=__import__("io").StringIO())
    pdf = Path(directory) / "invoice 7.pdf"
    pdf.write_bytes(b"%PDF-1.4\n\x00\xff" * 50)
    email = EmailMultiAlternatives("Invoice", "See attached.", to=["ida@example.com"],
                                   headers={"Idempotency-Key": "invoice:7"})
    email.attach_alternative('<p>Invoice</p><img src="cid:logo">', "text/html")
    email.attach_alternative("BEGIN:VCALENDAR\r\nMETHOD:REQUEST\r\nEND:VCALENDAR\r\n",
                             "text/calendar")
    email.attach("notes.txt", "héllo", "text/plain")
    email.attach_file(str(pdf))
    logo = MIMEImage(b"\x89PNG\r\n\x1a\n\x00", "png")
    logo.add_header("Content-ID", "<logo>")
    email.attach(logo)
    return {"sent": email.send()}


def main() -> None:
    engine, database, mode, *rest = sys.argv[1:]
    configure(engine, database)
    if mode == "scenario":
        print(json.dumps(scenario()))
    elif mode == "attachments":
        print(json.dumps(attachments(*rest)))
    else:
        from django.core.management import execute_from_command_line

        execute_from_command_line(["manage.py", *rest])


if __name__ == "__main__":
    main()
