"""docs/failover.md's and docs/callbacks.md's examples run as written: the failover example
on SQLite in a temporary directory (its database file name unchanged), and the callback
receiver fed real signed callbacks by ``CallbackSender`` on both engines."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from postlane.callbacks import CallbackConfig, CallbackSender, register_endpoint
from postlane.core.outcomes import Outcome
from postlane.providers.testing import RecordingProvider
from postlane.store import Store
from postlane.worker import Worker
from tests.conftest import msg
from tests.integration.worker_helpers import fast_config

DOCS = Path(__file__).resolve().parents[2] / "docs"


def example(page: str, name: str, replacements: dict[str, str] | None = None) -> str:
    match = re.search(rf"<!-- example: {re.escape(name)} -->\s*\n```[a-z]*\n(.*?)\n```",
                      (DOCS / page).read_text(encoding="utf-8"), flags=re.S)
    assert match, f"no example {name!r} in docs/{page}"
    source = match.group(1)
    for old, new in (replacements or {}).items():
        assert old in source, f"example {name!r} no longer contains {old!r}"
        source = source.replace(old, new)
    return source


def test_the_failover_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(example("failover.md", "failover"), "failover.md:failover", "exec",
                 dont_inherit=True), {"__name__": "__main__"})
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert re.fullmatch(r"receipt:\d+ sent attempts: (primary -> )+backup", line), line


async def test_the_receiver_example(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    endpoint = await register_endpoint(store, "http://app.test/hooks/email-status")
    namespace: dict[str, Any] = {"__name__": "receiver"}
    exec(compile(example("callbacks.md", "receiver", {"whsec_...": endpoint.secret}),
                 "callbacks.md:receiver", "exec", dont_inherit=True), namespace)
    provider = RecordingProvider()
    provider.script_key("reset:bad", Outcome.permanent("550 5.1.1 no such user"))
    await store.enqueue_many([msg("reset:ok"), msg("reset:bad")])
    await Worker(store, provider, config=fast_config(drain=True)).run()
    transport = httpx.ASGITransport(app=namespace["app"])
    async with httpx.AsyncClient(transport=transport) as client:
        sender = CallbackSender(store, CallbackConfig(), client=client)
        assert await sender.deliver_due() == 2
        assert sender.counters == {"sent": 2}
        # The same event again, as after a lost answer: acknowledged, not handled twice.
        dead_letter = next(c for c in await store.list_callbacks()
                           if c.type == "delivery.dead_lettered")
        assert (await sender._attempt(dead_letter)).outcome == "sent"
        response = await client.post("http://app.test/hooks/email-status",
                                     content=b'{"forged": true}',
                                     headers={"webhook-id": "evt_1", "webhook-timestamp": "0",
                                              "webhook-signature": "v1,AAAA"})
        assert response.status_code == 400
    assert capsys.readouterr().out.strip() == "not delivered: reset:bad 550 5.1.1 no such user"
    assert namespace["handled"] == {c.message_id for c in await store.list_callbacks()}
