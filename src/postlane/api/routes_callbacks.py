"""``/v1/callbacks``: the application registers where it hears what became of its messages
(``postlane.callbacks``). A key with scope ``send`` manages the endpoints of its own
deliveries; an endpoint for every delivery (``all_deliveries``) needs scope ``operate``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Response
from pydantic import BaseModel, Field

from postlane.api.models import Strict, Text
from postlane.api.problems import ProblemError, forbidden, not_found, problem_responses
from postlane.api.routes import Sender, StoreDep, known_query_only
from postlane.callbacks import register_endpoint
from postlane.core.records import CallbackEndpoint
from postlane.core.redaction import redact_url
from postlane.errors import ConfigurationError

router = APIRouter(prefix="/v1", dependencies=[Depends(known_query_only)])

EventType = Literal["delivery.sent", "delivery.dead_lettered", "delivery.bounced",
                    "delivery.complained", "delivery.suppressed"]


class CallbackEndpointIn(Strict):
    url: Text = Field(min_length=1, max_length=2000,
                      description="Where to POST the events (http or https).")
    events: list[EventType] = Field(default_factory=list, max_length=5,
                                    description="Event types to receive; empty: all.")
    all_deliveries: bool = Field(
        default=False, description="Every delivery, not only this key's (scope `operate`).")


class CallbackEndpointOut(BaseModel):
    id: int
    url: str
    api_key_id: int | None = Field(description="Null: every delivery.")
    events: list[str]
    created_at: datetime
    disabled_at: datetime | None

    @classmethod
    def of(cls, endpoint: CallbackEndpoint) -> CallbackEndpointOut:
        return cls(id=endpoint.id, url=redact_url(endpoint.url), api_key_id=endpoint.api_key_id,
                   events=list(endpoint.events), created_at=endpoint.created_at,
                   disabled_at=endpoint.disabled_at)


class CallbackEndpointCreated(CallbackEndpointOut):
    secret: str = Field(description="The signing secret (`whsec_...`), shown only this once: "
                                    "verify `webhook-signature` with it.")


ERRORS = problem_responses(401, 403, 422, 503)


@router.post("/callbacks", status_code=201, response_model=CallbackEndpointCreated,
             tags=["callbacks"], summary="Register a status callback endpoint", responses=ERRORS)
async def post_callback(body: CallbackEndpointIn, store: StoreDep, key: Sender,
                        response: Response) -> CallbackEndpointCreated:
    """Signed events (Standard Webhooks) for this key's deliveries, or every delivery with
    `all_deliveries` (scope `operate`). Scope: `send`."""
    if body.all_deliveries and "operate" not in key.scopes:
        raise forbidden("an endpoint for every delivery needs scope operate")
    try:
        endpoint = await register_endpoint(
            store, body.url, events=body.events,
            api_key_id=None if body.all_deliveries else key.id)
    except ConfigurationError as exc:
        raise ProblemError(422, "invalid-request", "Invalid request", str(exc),
                           field="url") from None
    response.headers["Location"] = f"/v1/callbacks/{endpoint.id}"
    return CallbackEndpointCreated(**CallbackEndpointOut.of(endpoint).model_dump(),
                                   secret=endpoint.secret)


@router.get("/callbacks", response_model=list[CallbackEndpointOut], tags=["callbacks"],
            summary="Status callback endpoints", responses=ERRORS)
async def list_callbacks(store: StoreDep, key: Sender) -> list[CallbackEndpointOut]:
    """This key's endpoints (with scope `operate`: every endpoint). Scope: `send`."""
    endpoints = await store.list_callback_endpoints(
        key.id, every_key="operate" in key.scopes)
    return [CallbackEndpointOut.of(e) for e in endpoints]


@router.delete("/callbacks/{endpoint_id}", status_code=204, tags=["callbacks"],
               summary="Stop a status callback endpoint",
               responses=problem_responses(401, 403, 404, 422, 503))
async def delete_callback(
    endpoint_id: Annotated[int, Path(ge=1, le=2**63 - 1)], store: StoreDep, key: Sender,
) -> Response:
    """Callbacks still queued for it become dead. Scope: `send` (its own), `operate` (any)."""
    owner = None if "operate" in key.scopes else key.id
    if not await store.disable_callback_endpoint(endpoint_id, api_key_id=owner):
        raise not_found(f"no active callback endpoint {endpoint_id} of this key")
    return Response(status_code=204)
