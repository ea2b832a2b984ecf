"""The worker's send lines in the JSON log format carry the delivery id and the provider's
message id as fields (``extra=``), and never an address unredacted, on both engines."""

from __future__ import annotations

import json

import pytest
from conftest import msg
from worker_helpers import fast_config

from postlane.core.outcomes import Outcome
from postlane.logs import JsonFormatter
from postlane.providers.testing import RecordingProvider
from postlane.store import Store
from postlane.worker import Worker


async def test_send_lines_carry_delivery_and_provider_ids(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    sent = await store.enqueue(msg("log:sent", to="ada.lovelace@example.com"))
    dead = await store.enqueue(msg("log:dead", to="grace.hopper@example.com"))
    provider = RecordingProvider()
    provider.script_key("log:dead", Outcome.permanent("rcpt: 550 5.1.1 user unknown"))
    caplog.set_level("DEBUG", logger="postlane.worker")
    await Worker(store, provider, config=fast_config(drain=True)).run()
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records
             if r.name.startswith("postlane.worker")]
    by_id = {line.get("delivery_id"): line for line in lines if "lane" in line}
    assert by_id[sent.id]["provider_message_id"]
    assert by_id[sent.id]["attempt"] == 1 and by_id[sent.id]["lane"] == "interactive"
    assert "ALERT dead letter" in by_id[dead.id]["message"]
    text = "\n".join(json.dumps(line) for line in lines)
    assert "ada.lovelace@" not in text and "grace.hopper@" not in text
