"""Values for tests that need a ``Delivery`` without a database: one factory, shared."""

from __future__ import annotations

import datetime as dt
from typing import Any

from postlane.core.message import Delivery
from postlane.core.states import State


def delivery(key: str = "reset:42", **changes: Any) -> Delivery:
    """A leased delivery as a worker hands it to a provider; override any field."""
    now = dt.datetime.now(dt.UTC)
    fields: dict[str, Any] = dict(
        id=7, key=key, lane="interactive", channel="email", recipient="bob@example.com",
        sender="app@example.org", subject="Reset your password", text="Follow the link.\n",
        html=None, headers={}, metadata={}, import_id=None, template_id=None,
        template_version=None, state=State.SENDING, attempts=0, claims=1, run_at=now,
        expires_at=None, lease_owner="w", lease_expires_at=None, attempt_started_at=now,
        provider_message_id=None, dead_reason=None, last_error=None, created_at=now,
        updated_at=now, sent_at=None, finished_at=None,
    )
    fields.update(changes)
    return Delivery(**fields)
