"""``/v1/callbacks``: an API key registers where it hears about its own deliveries; an
endpoint for every delivery needs scope ``operate``; bad input stores nothing."""

from __future__ import annotations

from conftest import msg
from test_api import Api, api, body, problem  # noqa: F401  (api is a fixture)
from worker_helpers import fast_config

from postlane.providers.testing import RecordingProvider
from postlane.worker import Worker


async def test_a_key_registers_its_endpoint_and_hears_of_its_deliveries(api: Api) -> None:
    created = await api.client.post(
        "/v1/callbacks", json={"url": "https://app.example.com/postlane",
                               "events": ["delivery.sent", "delivery.dead_lettered"]},
        headers=api.auth("send"))
    assert created.status_code == 201, created.text
    mine = created.json()
    assert mine["secret"].startswith("whsec_") and mine["api_key_id"] is not None
    assert mine["events"] == ["delivery.sent", "delivery.dead_lettered"]
    assert created.headers["Location"] == f"/v1/callbacks/{mine['id']}"

    # Every delivery: scope operate only.
    refused = await api.client.post("/v1/callbacks", json={
        "url": "https://ops.example.com/hook", "all_deliveries": True}, headers=api.auth("send"))
    problem(refused, 403)
    everything = await api.client.post("/v1/callbacks", json={
        "url": "https://ops.example.com/hook", "all_deliveries": True}, headers=api.auth("all"))
    assert everything.status_code == 201 and everything.json()["api_key_id"] is None

    listed = await api.client.get("/v1/callbacks", headers=api.auth("send"))
    assert [e["id"] for e in listed.json()] == [mine["id"]]
    assert "secret" not in listed.json()[0]
    assert len((await api.client.get("/v1/callbacks", headers=api.auth("all"))).json()) == 2

    # Its own message is announced to it; one from another producer is not.
    assert (await api.send("api:1", body())).status_code == 201
    await api.store.enqueue(msg("app:1"))
    await Worker(api.store, RecordingProvider(), config=fast_config(drain=True)).run()
    callbacks = await api.store.list_callbacks()
    heard = sorted((c.endpoint_id, c.payload["data"]["key"]) for c in callbacks)
    assert heard == sorted([(mine["id"], "api:1"), (everything.json()["id"], "api:1"),
                            (everything.json()["id"], "app:1")])

    # Only its own endpoint can be removed by a send key.
    other = everything.json()["id"]
    problem(await api.client.delete(f"/v1/callbacks/{other}", headers=api.auth("send")), 404)
    gone = await api.client.delete(f"/v1/callbacks/{mine['id']}", headers=api.auth("send"))
    assert gone.status_code == 204
    listed = await api.client.get("/v1/callbacks", headers=api.auth("send"))
    assert listed.json()[0]["disabled_at"] is not None


async def test_bad_registrations_are_refused_and_store_nothing(api: Api) -> None:
    for payload in ({"url": "ftp://example.com/x"}, {"url": ""},
                    {"url": "https://example.com/x", "events": ["delivery.opened"]},
                    {"url": "https://example.com/x", "secret": "mine"}):
        problem(await api.client.post("/v1/callbacks", json=payload,
                                      headers=api.auth("send")), 422)
    problem(await api.client.post("/v1/callbacks", json={"url": "https://example.com/x"},
                                  headers=api.auth("read")), 403)
    problem(await api.client.post("/v1/callbacks", json={"url": "https://example.com/x"}), 401)
    assert await api.store.list_callback_endpoints() == []
