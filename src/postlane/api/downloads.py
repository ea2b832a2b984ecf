"""A stored attachment as an HTTP download, for the API and the dashboard alike.

Always ``Content-Disposition: attachment`` and ``X-Content-Type-Options: nosniff``: a part is
the sender's content, and an HTML or SVG file opened in place would run in the dashboard's
origin. The filename goes as RFC 6266 ``filename*`` (UTF-8) with an ASCII fallback.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import Response

from postlane.api.problems import not_found
from postlane.core.attachments import Attachment
from postlane.operations import stored_attachment
from postlane.store.roles import OperatorStore


async def stored_part(store: OperatorStore, delivery_id: int, position: int) -> Attachment:
    part = await stored_attachment(store, delivery_id, position)
    if part is None:
        raise not_found(f"message {delivery_id} has no attachment {position}")
    return part


def attachment_response(part: Attachment) -> Response:
    fallback = part.filename.encode("ascii", "replace").decode().replace('"', "_")
    disposition = f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(part.filename)}"
    return Response(part.content, media_type="application/octet-stream", headers={
        "Content-Disposition": disposition, "X-Content-Type-Options": "nosniff",
        "X-Postlane-Content-Type": part.content_type})
