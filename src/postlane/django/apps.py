"""The Django app: its management commands (``postlane_migrate``, ``postlane_worker``)."""

from __future__ import annotations

from django.apps import AppConfig


class PostlaneConfig(AppConfig):  # type: ignore[misc]  # Django ships no types
    name = "postlane.django"
    label = "postlane"
    verbose_name = "Postlane"
