"""The HTTP API takes attachments as base64 JSON (both engines): stored as given, listed in a
message's detail, downloadable byte for byte, refused clearly when malformed or too large;
the larger body limit holds for ``POST /v1/messages`` alone."""

from __future__ import annotations

import base64

import httpx

from postlane.store import Store
from tests.integration.test_api import Api, api, body, problem  # noqa: F401 (the fixture)

PDF = b"%PDF-1.4\n" + bytes(range(256)) * 8
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def parts() -> list[dict[str, object]]:
    return [
        {"filename": "reçu.pdf", "content_type": "application/pdf", "content": b64(PDF)},
        {"filename": "logo.png", "content_type": "image/png", "content": b64(PNG),
         "kind": "inline", "content_id": "logo"},
    ]


async def test_a_message_with_attachments_is_stored_listed_and_downloadable(api: Api) -> None:
    sent = await api.send("receipt:1", body(html='<img src="cid:logo">', attachments=parts()))
    assert sent.status_code == 201, sent.text
    id_ = sent.json()["id"]
    stored = await api.store.attachments_among([id_])
    assert [(p.filename, p.content, p.kind) for p in stored[id_]] == [
        ("reçu.pdf", PDF, "attachment"), ("logo.png", PNG, "inline")]
    detail = (await api.client.get(f"/v1/messages/{id_}", headers=api.auth())).json()
    assert detail["attachments"] == [
        {"position": 0, "filename": "reçu.pdf", "content_type": "application/pdf",
         "kind": "attachment", "content_id": None, "size": len(PDF)},
        {"position": 1, "filename": "logo.png", "content_type": "image/png",
         "kind": "inline", "content_id": "logo", "size": len(PNG)}]
    download = await api.client.get(f"/v1/messages/{id_}/attachments/0", headers=api.auth())
    assert download.status_code == 200 and download.content == PDF
    assert download.headers["content-disposition"].startswith("attachment;")
    assert "filename*=UTF-8''re%C3%A7u.pdf" in download.headers["content-disposition"]
    assert download.headers["x-content-type-options"] == "nosniff"
    missing = await api.client.get(f"/v1/messages/{id_}/attachments/2", headers=api.auth())
    problem(missing, 404)
    again = await api.send("receipt:1", body(html='<img src="cid:logo">', attachments=parts()))
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    changed = [parts()[0], {**parts()[1], "content": b64(PNG[:-1])}]
    other = await api.send("receipt:1", body(html='<img src="cid:logo">', attachments=changed))
    problem(other, 422)  # the same key with other bytes is another request


async def test_malformed_attachments_are_refused_with_the_field(api: Api) -> None:
    not_b64 = await api.send("a:1", body(attachments=[
        {"filename": "a.pdf", "content": "%%%"}]))
    assert "base64" in problem(not_b64, 422)["detail"] or problem(not_b64, 422)["errors"]
    no_cid = await api.send("a:2", body(html="<p>x</p>", attachments=[
        {"filename": "logo.png", "content_type": "image/png", "content": b64(PNG),
         "kind": "inline", "content_id": "logo"}]))
    data = problem(no_cid, 422)
    assert "cid:logo" in data["detail"] and data["field"] == "attachments"
    assert await api.store.get("a:2") is None


async def test_the_larger_body_limit_is_for_posting_messages_only(api: Api) -> None:
    big = b"\x00" * (2 * 1024 * 1024)  # 2 MiB: over the 1 MiB default, under the message limit
    sent = await api.send("big:1", body(attachments=[
        {"filename": "big.bin", "content": b64(big)}]))
    assert sent.status_code == 201, sent.text
    elsewhere = await api.client.post("/v1/dead-letters/replay", headers=api.auth(),
                                      content=b"{" + b" " * (2 * 1024 * 1024) + b"}")
    problem(elsewhere, 413)
    too_big = await api.send("big:2", body(attachments=[
        {"filename": "big.bin", "content": b64(b"\x00" * (11 * 1024 * 1024))}]))
    data = problem(too_big, 422)
    assert "per-attachment limit" in data["detail"]
    assert await api.store.get("big:2") is None


async def test_the_server_s_attachment_limits_apply_at_enqueue(store: Store) -> None:
    from conftest import store_url

    from postlane.api import create_app
    from postlane.api.app import message_body_limit
    from postlane.api.keys import create_key
    from postlane.core.attachments import AttachmentLimits

    limits = AttachmentLimits(max_attachment_bytes=100, max_total_bytes=150)
    assert message_body_limit(AttachmentLimits(max_total_bytes=30 * 2**20), 2**20) == (
        40 * 2**20 + 2**20)
    _, token = await create_key(store, "send", name="limits")
    app = create_app(store_url(store), sample_interval_s=0, attachment_limits=limits)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": "l:1"}
            two = [{"filename": f"{n}.bin", "content": b64(b"x" * 80)} for n in (1, 2)]
            answer = await client.post("/v1/messages", headers=headers,
                                       json=body(attachments=two))
    data = problem(answer, 422)
    assert "total 160 bytes, over the per-message limit of 150" in data["detail"]
    assert await store.get("l:1") is None
