"""The dashboard shows the second channel without a browser: a message page names its SMS
fallback (and the SMS page the email), and the import table shows a canary's state."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import httpx
from test_api_dashboard import client, login, store  # noqa: F401  (fixtures)
from test_imports import users, write_csv
from test_sms_fallback import reset, sweeper

from postlane.api.keys import create_key
from postlane.core.records import Transition
from postlane.core.states import State
from postlane.imports import import_csv
from postlane.store import Store
from postlane.templates import add_template


async def test_the_pair_and_the_canary_on_the_dashboard(
        client: httpx.AsyncClient, store: Store, tmp_path: Path) -> None:
    email = await store.enqueue(reset("reset:dash"))
    [claimed] = await store.claim_batch("interactive", 1, "w", timedelta(seconds=30))
    await store.set_state_if_sending_many("w", [Transition(
        id=claimed.id, claims=claimed.claims, state=State.DEAD, event="dead_lettered",
        dead_reason="permanent")])
    assert await sweeper(store).fallbacks() == 1
    pair = await store.sms_fallback_pair(email.id)
    assert pair is not None and pair.sms_id is not None
    await add_template(store, "welcome", subject="Hi {{ name }}", text="Hello {{ name }}")
    await import_csv(store, write_csv(tmp_path / "u.csv", users(6)), template="welcome",
                     import_id="spring", canary=2)
    _, token = await create_key(store, "read", name="viewer")
    await login(client, token)
    page = (await client.get(f"/dashboard/messages/{email.id}")).text
    assert "SMS fallback" in page and f"/dashboard/messages/{pair.sms_id}" in page
    sms_page = (await client.get(f"/dashboard/messages/{pair.sms_id}")).text
    assert "Fallback of" in sms_page and "GSM-7, 1 segment(s)" in sms_page
    overview = (await client.get("/dashboard")).text
    assert "canary waiting, 4 held" in overview
