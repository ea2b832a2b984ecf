"""The sandbox's delivery events: what it would post to your webhook after accepting.

Recipients matching ``bounce`` hard-bounce, those matching ``complain`` complain, the rest
are delivered. Events are signed with Standard Webhooks, exactly as ``postlane.webhooks``
verifies them, and posted with httpx (or handed to a callable in-process).
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from postlane.providers.sandbox import SandboxEngine
from postlane.webhooks.signatures import sign_standard

_ids = itertools.count(1)


def webhook_request(secret: str, event_type: str, message_id: str, to: str, *,
                    event_id: str | None = None, timestamp: int | None = None,
                    bounce_type: str = "hard") -> tuple[dict[str, str], bytes]:
    """Headers and body of one sandbox webhook, signed with ``secret``."""
    data: dict[str, object] = {"message_id": message_id, "to": to}
    if event_type == "email.bounced":
        data["bounce_type"] = bounce_type
    body = json.dumps({"type": event_type, "data": data}).encode()
    event_id = event_id or f"evt_{next(_ids)}_{message_id}"
    timestamp = int(time.time()) if timestamp is None else timestamp
    headers = {
        "webhook-id": event_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign_standard(secret, event_id, timestamp, body),
        "content-type": "application/json",
    }
    return headers, body


Sender = Callable[[dict[str, str], bytes], Awaitable[object]]


@dataclass
class SandboxEvents:
    """Collects the engine's acceptances and turns them into signed webhook requests."""

    secret: str
    bounce: str | None = None
    complain: str | None = None
    queue: list[tuple[dict[str, str], bytes]] = field(default_factory=list)

    def attach(self, engine: SandboxEngine) -> None:
        engine.on_accept = self._accepted

    def _accepted(self, key: str, message_id: str, to: str) -> None:
        if self.bounce and re.search(self.bounce, to):
            kind = "email.bounced"
        elif self.complain and re.search(self.complain, to):
            kind = "email.complained"
        else:
            kind = "email.delivered"
        self.queue.append(webhook_request(self.secret, kind, message_id, to))

    async def flush(self, send: Sender) -> int:
        """Hand every queued event to ``send`` (e.g. an HTTP POST); returns how many."""
        queued, self.queue = self.queue, []
        for headers, body in queued:
            await send(headers, body)
        return len(queued)


def http_sender(url: str) -> Sender:
    import httpx

    async def _send(headers: dict[str, str], body: bytes) -> object:
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.post(url, content=body, headers=headers)
            return response.status_code
    return _send
