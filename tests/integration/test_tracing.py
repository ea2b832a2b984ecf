"""OpenTelemetry traces (``postlane.tracing``): off unless enabled; once enabled, one trace
per delivery from the application's enqueue to each send attempt in the worker, the key as
an attribute, on both engines (the SDK's in-memory exporter, a real worker)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from worker_helpers import fast_config

import postlane
from postlane import Message, tracing
from postlane.core.outcomes import Outcome
from postlane.errors import ConfigurationError
from postlane.providers.testing import RecordingProvider
from postlane.store import Store
from postlane.worker import Worker


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        yield exporter
    finally:
        tracing.disable()


async def test_one_trace_per_delivery_from_enqueue_to_send(
        store: Store, spans: InMemorySpanExporter) -> None:
    first = await store.enqueue(Message(key="reset:1", to="a@example.com", text="t"))
    tracing.enqueued([Message(key="reset:1", to="a@example.com", text="t")], [first])
    second = await store.enqueue(Message(key="reset:2", to="b@example.com", text="t"))
    tracing.enqueued([Message(key="reset:2", to="b@example.com", text="t")], [second])
    provider = RecordingProvider()
    provider.script_key("reset:2", Outcome.transient("451 try later"))
    await Worker(store, provider, config=fast_config(drain=True)).run()
    by_key: dict[str, list[object]] = {}
    for span in spans.get_finished_spans():
        assert span.attributes is not None
        by_key.setdefault(str(span.attributes["postlane.key"]), []).append(span)
    assert set(by_key) == {"reset:1", "reset:2"}
    for key, found in by_key.items():
        trace_id, root = tracing.trace_ids(key)
        assert {s.context.trace_id for s in found} == {trace_id}  # type: ignore[attr-defined]
        assert {s.parent.span_id for s in found} == {root}  # type: ignore[attr-defined]
    names = [s.name for s in by_key["reset:2"]]  # type: ignore[attr-defined]
    assert names == ["postlane.enqueue", "postlane.send", "postlane.send"]
    attempts = [s.attributes for s in by_key["reset:2"][1:]]  # type: ignore[attr-defined]
    assert [(a["postlane.attempt"], a["postlane.outcome"]) for a in attempts] == [
        (1, "transient"), (2, "accepted")]
    sent = await store.get(second.id)
    assert sent is not None and sent.provider_message_id
    assert attempts[1]["postlane.provider_message_id"] == sent.provider_message_id
    assert attempts[0]["postlane.delivery_id"] == second.id
    text = repr([dict(s.attributes or {}) for s in spans.get_finished_spans()])
    assert "@example.com" not in text  # never the address


def test_the_outbox_traces_what_it_creates_and_links_the_callers_span(
        tmp_path: object, spans: InMemorySpanExporter) -> None:
    import asyncio
    from pathlib import Path

    url = f"sqlite:///{Path(str(tmp_path)) / 'app.db'}"

    async def migrate() -> None:
        async with postlane.open_store(url) as store:
            await store.migrate()

    asyncio.run(migrate())
    tracer = TracerProvider().get_tracer("app")
    with (sqlite3.connect(url.removeprefix("sqlite:///")) as conn,
          tracer.start_as_current_span("POST /signup") as request):
        postlane.enqueue(conn, Message(key="welcome:7", to="c@example.com", text="t"))
        postlane.enqueue(conn, Message(key="welcome:7", to="c@example.com", text="t"))
    (span,) = spans.get_finished_spans()  # the repeat created nothing, and adds no span
    assert span.name == "postlane.enqueue"
    assert span.context.trace_id == tracing.trace_ids("welcome:7")[0]
    assert [link.context.span_id for link in span.links] == [
        request.get_span_context().span_id]


def test_traces_are_off_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    tracing.disable()
    assert not tracing.enabled()
    monkeypatch.delenv(tracing.ENV, raising=False)
    assert tracing.enable_from_env() is False and not tracing.enabled()
    monkeypatch.setenv(tracing.ENV, "zipkin")
    with pytest.raises(ConfigurationError, match="only tracer is 'otel'"):
        tracing.enable_from_env()
    monkeypatch.setenv(tracing.ENV, "otel")
    try:
        assert tracing.enable_from_env() is True and tracing.enabled()
    finally:
        tracing.disable()
