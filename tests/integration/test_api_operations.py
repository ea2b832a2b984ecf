"""The HTTP API's hand on messages, on both engines: the list by state with keyset
pagination, cancel and resolve for one message and for a filtered selection (a dry run,
then a confirmation with the dry run's count and bound)."""

from __future__ import annotations

from typing import Any

from test_api import Api, api, body, problem
from test_operations import ambiguous

from postlane import State
from postlane.core.records import DeliveryFilter

__all__ = ["api"]


async def listing(api: Api, query: str) -> tuple[list[str], str | None]:
    response = await api.client.get(f"/v1/messages?{query}", headers=api.auth("read"))
    assert response.status_code == 200, response.text
    data = response.json()
    return [m["key"] for m in data["messages"]], data["next_cursor"]


async def test_messages_are_listed_newest_first_a_page_at_a_time(api: Api) -> None:
    for i in range(5):
        await api.send(f"bulk:{i}", body(lane="bulk", to="same@example.com"))
    await api.send("reset:1", body())
    keys, cursor = await listing(api, "lane=bulk&limit=2")
    assert keys == ["bulk:4", "bulk:3"] and cursor
    # A message queued meanwhile does not shift the pages that follow.
    await api.send("bulk:late", body(lane="bulk"))
    more, cursor = await listing(api, f"lane=bulk&limit=2&cursor={cursor}")
    assert more == ["bulk:2", "bulk:1"]
    last, end = await listing(api, f"lane=bulk&limit=2&cursor={cursor}")
    assert last == ["bulk:0"] and end is None
    assert (await listing(api, "state=pending&recipient=same@example.com&limit=10"))[0] == [
        f"bulk:{i}" for i in (4, 3, 2, 1, 0)]
    assert (await listing(api, "state=sent"))[0] == []
    everything, _ = await listing(api, "")
    assert len(everything) == 7
    for bad in ("cursor=nonsense", "cursor=eyJ2IjoxLCJiZWZvcmUiOiJ4In0", "state=stuck",
                "limit=0", "colour=red"):
        problem(await api.client.get(f"/v1/messages?{bad}", headers=api.auth("read")), 422)


async def test_one_message_is_cancelled_once(api: Api) -> None:
    created = (await api.send("receipt:1", body())).json()
    url = f"/v1/messages/{created['id']}/cancel"
    done = await api.client.post(url, json={"reason": "customer asked"},
                                 headers=api.auth("operate"))
    assert done.status_code == 200 and done.json() == {"id": created["id"],
                                                       "state": "cancelled"}
    timeline = (await api.client.get(f"/v1/messages/{created['id']}",
                                     headers=api.auth("read"))).json()["timeline"]
    assert timeline[-1]["kind"] == "cancelled"
    assert timeline[-1]["data"]["reason"].startswith("customer asked (cancelled by apikey:")
    again = problem(await api.client.post(url, headers=api.auth("operate")), 409)
    assert again["type"] == "urn:postlane:problem:not-applicable"
    problem(await api.client.post("/v1/messages/999999/cancel", headers=api.auth("operate")),
            404)


async def test_one_ambiguous_message_is_resolved(api: Api) -> None:
    first, second = await ambiguous(api.store, "a", "b")
    headers = api.auth("operate")
    sent = await api.client.post(f"/v1/messages/{first}/resolve", headers=headers,
                                 json={"resolution": "sent", "provider_message_id": "pm-9",
                                       "note": "seen in the provider's log"})
    assert sent.status_code == 200 and sent.json() == {"id": first, "state": "sent"}
    delivery = await api.store.get(first)
    assert delivery is not None and delivery.provider_message_id == "pm-9"
    events = await api.store.timeline(first)
    assert events[-1].data["by"].startswith("apikey:operate#")
    resend = await api.client.post(f"/v1/messages/{second}/resolve", headers=headers,
                                   json={"resolution": "resend"})
    assert resend.json()["state"] == "pending"
    problem(await api.client.post(f"/v1/messages/{first}/resolve", headers=headers,
                                  json={"resolution": "dead"}), 409)
    problem(await api.client.post(f"/v1/messages/{first}/resolve", headers=headers,
                                  json={"resolution": "maybe"}), 422)
    problem(await api.client.post("/v1/messages/999999/resolve", headers=headers,
                                  json={"resolution": "sent"}), 404)


async def bulk(api: Api, action: str, payload: dict[str, Any],
               status: int = 200) -> dict[str, Any]:
    response = await api.client.post(f"/v1/messages/{action}", json=payload,
                                     headers=api.auth("operate"))
    assert response.status_code == status, response.text
    data: dict[str, Any] = response.json()
    return data


async def test_a_selection_is_cancelled_after_a_dry_run_and_a_confirmation(api: Api) -> None:
    for i in range(4):
        await api.send(f"digest:{i}", body(lane="bulk", import_id="weekly"))
    await api.send("reset:1", body())
    preview = await bulk(api, "cancel", {"import_id": "weekly", "dry_run": True})
    assert preview["matched"] == 4 and preview["acted"] == 0 and preview["dry_run"]
    assert preview["selection"] == {"state": "queued", "import_id": "weekly"}
    unconfirmed = problem(await api.client.post(
        "/v1/messages/cancel", json={"import_id": "weekly"}, headers=api.auth("operate")), 409)
    assert unconfirmed["type"] == "urn:postlane:problem:confirmation-required"
    assert unconfirmed["preview"]["matched"] == 4
    await api.send("digest:late", body(lane="bulk", import_id="weekly"))
    done = await bulk(api, "cancel", {"import_id": "weekly", "reason": "wrong week",
                                      "expected": preview["matched"],
                                      "upto_id": preview["upto_id"]})
    assert done["acted"] == 4 and not done["dry_run"]
    left = await api.store.list_deliveries(DeliveryFilter(state="queued"))
    assert sorted(d.key for d in left) == ["digest:late", "reset:1"]
    refused = problem(await api.client.post(
        "/v1/messages/cancel", json={"state": "sent", "dry_run": True},
        headers=api.auth("operate")), 409)
    assert "not sent" in refused["detail"]


async def test_a_selection_of_ambiguous_messages_is_resolved(api: Api) -> None:
    ids = await ambiguous(api.store, "a", "b", "c")
    preview = await bulk(api, "resolve", {"resolution": "dead", "dry_run": True})
    assert preview["matched"] == 3 and preview["selection"] == {"state": "ambiguous"}
    grown = problem(await api.client.post(
        "/v1/messages/resolve", headers=api.auth("operate"),
        json={"resolution": "dead", "expected": 2, "upto_id": preview["upto_id"]}), 409)
    assert grown["preview"]["matched"] == 3
    done = await bulk(api, "resolve", {"resolution": "dead", "note": "never arrived",
                                       "expected": 3, "upto_id": preview["upto_id"]})
    assert done["acted"] == 3
    for i in ids:
        delivery = await api.store.get(i)
        assert delivery is not None and delivery.state is State.DEAD
    problem(await api.client.post("/v1/messages/resolve", headers=api.auth("operate"),
                                  json={"resolution": "sent", "colour": "red"}), 422)
