"""The outbox from the web frameworks users run, each as its own small app: a request writes
a business row and its email together, and a failing request rolls both back together.

- FastAPI with an async SQLAlchemy ``AsyncSession`` dependency, over asyncpg, over
  psycopg 3 and over aiosqlite (SQLite);
- Flask with Flask-SQLAlchemy's ``db.session``, on PostgreSQL (psycopg2) and on SQLite.
(Django: test_django.py.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

import httpx
import pytest
from fastapi import Depends, FastAPI, HTTPException, Request
from flask import Flask, abort
from flask import request as flask_request
from flask_sqlalchemy import SQLAlchemy
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from test_outbox import accounts, any_store, pg_store, sqlite_store

import postlane
from postlane import Message
from postlane.store import Store

assert pg_store and sqlite_store and any_store  # fixtures, imported for this module's tests

INSERT = "INSERT INTO accounts VALUES (:id, :email)"


def welcome(account_id: int, email: str) -> Message:
    return Message(key=f"welcome:{account_id}", to=email, subject="Welcome",
                   text="Hello from the shop")


# -- FastAPI + async SQLAlchemy ------------------------------------------------------------
class Signup(BaseModel):
    id: int
    email: str
    fail: bool = False


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    """The usual dependency: a session per request, closed (rolled back unless committed)
    when the request ends."""
    async with request.app.state.sessions() as session:
        yield session


def fastapi_app(url: str) -> FastAPI:
    app = FastAPI()
    app.state.engine = create_async_engine(url)
    app.state.sessions = async_sessionmaker(app.state.engine, expire_on_commit=False)

    @app.post("/signup")
    async def signup(body: Signup,
                     session: Annotated[AsyncSession, Depends(get_session)]) -> dict[str, int]:
        await session.execute(text(INSERT), {"id": body.id, "email": body.email})
        result = await postlane.enqueue_async(session, welcome(body.id, body.email))
        if body.fail:
            raise HTTPException(409, "the payment failed")  # nothing committed
        await session.commit()
        return {"delivery": result.id}

    return app


@pytest.fixture(params=["asyncpg", "psycopg", "aiosqlite"])
def async_target(request: pytest.FixtureRequest) -> tuple[Store, str]:
    """A migrated store and the SQLAlchemy async URL of its database over one driver."""
    if request.param == "aiosqlite":
        store: Store = request.getfixturevalue("sqlite_store")
        return store, f"sqlite+aiosqlite:///{store.path}"  # type: ignore[attr-defined]
    store = request.getfixturevalue("pg_store")
    return store, store.url.replace(  # type: ignore[attr-defined]
        "postgresql://", f"postgresql+{request.param}://", 1)


async def test_fastapi_async_session(async_target: tuple[Store, str]) -> None:
    store, url = async_target
    app = fastapi_app(url)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://app") as client:
        failed = await client.post("/signup", json={"id": 1, "email": "ada@example.com",
                                                    "fail": True})
        assert failed.status_code == 409
        assert await store.get("welcome:1") is None
        assert await accounts(store) == []

        ok = await client.post("/signup", json={"id": 2, "email": "bo@example.com"})
        assert ok.status_code == 200
    await app.state.engine.dispose()
    d = await store.get("welcome:2")
    assert d is not None and d.id == ok.json()["delivery"] and d.recipient == "bo@example.com"
    assert await accounts(store) == [2]
    assert (await store.stats()).states["pending"] == 1


# -- Flask + Flask-SQLAlchemy --------------------------------------------------------------
def flask_app(url: str) -> tuple[Flask, SQLAlchemy]:
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = url
    db = SQLAlchemy(app)

    @app.post("/signup")
    def signup() -> dict[str, int]:
        body = flask_request.get_json()
        db.session.execute(text(INSERT), {"id": body["id"], "email": body["email"]})
        result = postlane.enqueue(db.session, welcome(body["id"], body["email"]))
        if body.get("fail"):
            db.session.rollback()
            abort(409)
        db.session.commit()
        return {"delivery": result.id}

    return app, db


async def test_flask_sqlalchemy_session(any_store: Store) -> None:
    store, engine = any_store, any_store.engine
    url = (store.url.replace("postgresql://", "postgresql+psycopg2://", 1)  # type: ignore[attr-defined]
           if engine == "postgres" else f"sqlite:///{store.path}")  # type: ignore[attr-defined]
    app, db = flask_app(url)
    client = app.test_client()
    failed = client.post("/signup", json={"id": 1, "email": "ada@example.com", "fail": True})
    assert failed.status_code == 409
    assert await store.get("welcome:1") is None
    assert await accounts(store) == []

    ok = client.post("/signup", json={"id": 2, "email": "bo@example.com"})
    assert ok.status_code == 200
    with app.app_context():
        db.engine.dispose()
    d = await store.get("welcome:2")
    assert d is not None and d.id == ok.get_json()["delivery"]
    assert await accounts(store) == [2]
    assert (await store.stats()).states["pending"] == 1
