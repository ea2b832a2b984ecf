"""The OpenAPI document against the app itself: schemathesis generates requests for every
operation (in-process ASGI, SQLite) and checks that no answer is a 5xx and that each answer
conforms to the document (status codes, content types, bodies, headers).

Every check runs but ``positive_data_acceptance`` ("schema-valid data gets a 2xx"): the
document cannot say everything a message is checked against (an address's syntax per
RFC 5322, an SMS needing E.164, text or html being required for email), so a schema-valid
body can still be a 422 ``invalid-message`` with its ``field`` — which the document
declares.

Bounded: a few dozen examples per operation, so the whole run stays well under a minute;
derandomized, so that a run is repeatable (random runs found the bugs this document's
history fixed; the one false alarm left was a surrogate pair counted as two characters).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import positive_data_acceptance

from postlane import Message, open_store
from postlane.api import create_app
from postlane.api.keys import create_key
from postlane.core.outcomes import Outcome
from postlane.providers.testing import RecordingProvider
from postlane.worker import Worker

TOKEN: dict[str, str] = {}


async def _prepare(url: str) -> str:
    """A migrated database with a key, a few deliveries and dead letters to find."""
    from worker_helpers import fast_config

    async with open_store(url) as store:
        await store.migrate()
        _, token = await create_key(store, "send,read,operate", name="schemathesis")
        provider = RecordingProvider()
        for i in range(1, 6):
            await store.enqueue(Message(key=f"seed:{i}", to=f"user{i}@example.com",
                                        subject="Seed", text="hello", lane="bulk"))
            if i % 2:
                provider.script_key(f"seed:{i}", Outcome.permanent("550 unknown user"))
        await Worker(store, provider, config=fast_config(drain=True)).run()
    return token


# The document comes from the app itself; the database is made before the first request
# (the app's lifespan opens it then) by the module fixture below.
_DIR = Path(tempfile.mkdtemp(prefix="postlane-schema-"))
URL = f"sqlite:///{_DIR / 'postlane.db'}"
APP = create_app(URL, sample_interval_s=0)
schema = schemathesis.openapi.from_dict(APP.openapi())
schema.app = APP


@pytest.fixture(scope="module", autouse=True)
def database() -> Iterator[None]:
    TOKEN["value"] = asyncio.run(_prepare(URL))
    try:
        yield
    finally:
        asgi.shutdown_lifespans()  # closes the app's store
        shutil.rmtree(_DIR, ignore_errors=True)


@schema.parametrize()
@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                 HealthCheck.function_scoped_fixture])
def test_the_app_keeps_its_openapi_document(case: Any) -> None:
    case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN['value']}"},
                           excluded_checks=[positive_data_acceptance])
