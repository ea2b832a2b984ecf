"""Postlane for Django: ``EMAIL_BACKEND = "postlane.django.EmailBackend"``.

``send_mail``, ``EmailMessage(...).send()`` and ``send_mass_mail`` then enqueue on Django's
own database connection, inside the caller's ``transaction.atomic()`` block (a rollback
leaves no email) or, outside one, committed at once. Add ``"postlane.django"`` to
``INSTALLED_APPS`` for ``manage.py postlane_migrate`` and ``manage.py postlane_worker``.
See docs/frameworks.md for the mapping of an ``EmailMessage`` to deliveries.
"""

from __future__ import annotations

from postlane.django.backend import EmailBackend, outbox

__all__ = ["EmailBackend", "outbox"]
