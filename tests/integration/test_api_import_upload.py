"""Starting an import by uploading a CSV: the same import as `postlane import`."""

from __future__ import annotations

import pytest

from postlane.templates import add_template
from tests.integration.test_api import Api, api, problem  # noqa: F401  (the fixture)

pytestmark = pytest.mark.asyncio

ROWS = "user_id,email,name\n" + "".join(f"{i},u{i}@example.com,User {i}\n" for i in range(8))


async def upload(api: Api, import_id: str, content: str, **params: str):  # type: ignore[no-untyped-def]
    return await api.client.post(
        f"/v1/imports/{import_id}", headers=api.auth("operate"),
        params={"template": "welcome", **params},
        files={"file": ("users.csv", content.encode(), "text/csv")})


async def test_an_uploaded_csv_is_imported_once(api: Api) -> None:
    await add_template(api.store, "welcome", subject="Hi {{ name }}", text="Hello {{ name }}")
    first = await upload(api, "autumn", ROWS + "x,not-an-address,X\n")
    assert first.status_code == 201, first.text
    run = first.json()
    assert (run["rows_read"], run["rows_created"], run["rows_skipped"]) == (9, 8, 1)
    assert run["file"] == "users.csv" and run["problems"][0]["line"] == 10
    again = (await upload(api, "autumn", ROWS)).json()
    assert again["rows_created"] == 0 and again["rows_enqueued"] == 8  # nothing twice
    delivery = await api.store.get("welcome:3:autumn")
    assert delivery is not None and delivery.subject == "Hi User 3"
    assert delivery.lane == "bulk" and delivery.import_id == "autumn"
    shown = (await api.client.get("/v1/imports/autumn", headers=api.auth("read"))).json()
    assert shown["deliveries"]["created"] == 8


async def test_an_upload_can_start_small(api: Api) -> None:
    await add_template(api.store, "welcome", subject="Hi {{ name }}", text="Hello {{ name }}")
    run = await upload(api, "winter", ROWS, canary="3")
    assert run.status_code == 201, run.text
    shown = (await api.client.get("/v1/imports/winter", headers=api.auth("read"))).json()
    assert shown["canary"]["state"] == "waiting" and shown["canary"]["size"] == 3
    assert shown["canary"]["held"] == 5 and shown["canary"]["deliveries"] == {"pending": 3}
    problem(await upload(api, "w2", ROWS, canary="0"), 422)


async def test_refusals_are_problems(api: Api) -> None:
    await add_template(api.store, "welcome", subject="Hi {{ name }}", text="Hello {{ name }}")
    strict = problem(await upload(api, "s1", ROWS + "x,bad,X\n", strict="true"), 422)
    assert "line 10" in strict["detail"]
    assert await api.store.get("welcome:0:s1") is None  # strict: nothing written
    problem(await upload(api, "s2", "email\nu@example.com\n"), 422)  # no user_id column
    problem(await upload(api, "s3", ROWS, template="nope"), 404)
    unauthorised = await api.client.post(
        "/v1/imports/s4", headers=api.auth("read"), params={"template": "welcome"},
        files={"file": ("u.csv", ROWS.encode(), "text/csv")})
    problem(unauthorised, 403)


@pytest.mark.parametrize("content", [b"\xff\xfe\x00garbage", b"", b"user_id,email\n\x00,\x00\n"])
async def test_garbage_uploads_are_refused_not_crashed(api: Api, content: bytes) -> None:
    await add_template(api.store, "welcome", subject="Hi", text="Hello")
    response = await api.client.post(
        "/v1/imports/g", headers=api.auth("operate"), params={"template": "welcome"},
        files={"file": ("u.csv", content, "text/csv")})
    assert response.status_code in (201, 422), response.text
