"""What one API process holds: the store, the in-memory stats sampler, the session signer,
and the FastAPI dependencies that hand them (and the caller's API key) to routes."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from postlane.api.keys import authenticate
from postlane.api.problems import ProblemError, forbidden, unauthorized
from postlane.api.sessions import Sessions
from postlane.core.records import ApiKey
from postlane.metrics import FleetSampler, StoreCollector
from postlane.store.base import Store
from postlane.webhooks.sns_certificates import SnsCertificates


@dataclass
class AppState:
    store_url: str
    lanes: tuple[str, ...]
    store: Store | None = None
    sampler: FleetSampler | None = None
    collector: StoreCollector | None = None
    sessions: Sessions = field(default_factory=Sessions)
    max_body_bytes: int = 1024 * 1024
    cookie_secure: bool = False
    unsubscribe_secrets: tuple[bytes, ...] = ()
    """Verify one-click unsubscribe tokens (``POSTLANE_UNSUBSCRIBE_SECRET``); none: every
    link is refused, saying that unsubscribe is not configured."""
    sns_certificates: SnsCertificates = field(default_factory=SnsCertificates)
    """The SES webhook's certificate cache (one per process). Always the default: no option
    reaches its test-only ``base_url``."""

    def require_store(self) -> Store:
        if self.store is None:
            raise ProblemError(503, "store-unavailable", "Database unavailable",
                               "the server has not opened its database (yet)")
        return self.store

    def require_sampler(self) -> FleetSampler:
        self.require_store()
        assert self.sampler is not None
        return self.sampler


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.postlane
    return state


def get_store(request: Request) -> Store:
    return app_state(request).require_store()


bearer = HTTPBearer(auto_error=False, scheme_name="ApiKey",
                    description="An API key (`postlane apikey create`): "
                                "`Authorization: Bearer pl_...`.")


async def check_key(store: Store, token: str | None, scope: str) -> ApiKey:
    """The active API key of ``token``, which must grant ``scope``; 401 / 403 if not."""
    if token is None:
        raise unauthorized("send an API key: `Authorization: Bearer pl_...` "
                           "(create one with `postlane apikey create`)")
    key = await authenticate(store, token)
    if key is None:
        raise unauthorized("the API key is unknown or revoked")
    if scope not in key.scopes:
        raise forbidden(f"API key {key.prefix}... ({key.name}) lacks the {scope!r} scope "
                        f"(it has: {', '.join(key.scopes)})")
    return key


CHECKED_KEY = "postlane_api_key"
"""Where ``AuthFirst`` leaves the key it checked, in the request's scope state."""


def require(scope: str) -> Callable[..., Coroutine[Any, Any, ApiKey]]:
    """A dependency: the caller's API key, which must grant ``scope`` (401 / 403 if not).
    ``AuthFirst`` checks it before the body is read; this takes its answer (or checks, when
    the route is called some other way)."""

    async def _key(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
    ) -> ApiKey:
        checked = request.scope.get("state", {}).get(CHECKED_KEY)
        if isinstance(checked, ApiKey) and scope in checked.scopes:
            return checked
        return await check_key(get_store(request), credentials.credentials
                               if credentials is not None else None, scope)

    _key.postlane_scope = scope  # type: ignore[attr-defined]  # read by AuthFirst
    return _key


def actor(key: ApiKey) -> str:
    """Who did it, as kept on replayed and discarded entries."""
    return f"apikey:{key.name}#{key.id}"
