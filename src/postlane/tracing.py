"""Optional OpenTelemetry traces: one trace per delivery, from enqueue to every send attempt.

Off unless configured: nothing here imports OpenTelemetry until ``enable`` is called (by the
application with its ``TracerProvider``, or by ``postlane worker`` and ``postlane serve``
when ``POSTLANE_TRACING=otel`` is set, with the global provider that
``opentelemetry-instrument`` or the application's own SDK set-up installed). Needs the
``otel`` extra (``pip install 'postlane[otel]'``).

**One trace per delivery, without storing a context.** Enqueue and send happen in
different processes (the application, then a worker, maybe on another host, maybe after a
replay days later), and the delivery row has no room for a trace context. So the trace id
is derived from the idempotency key (SHA-256), which travels with every attempt and every
replay: each span's parent is a virtual root span whose ids are the key's. Spans:

- ``postlane.enqueue`` where a delivery is created (``postlane.enqueue`` and its async
  and bulk forms, in the application's transaction; ``POST /v1/messages``), linked to the
  caller's current span when there is one (the request that enqueued it). A rolled-back
  transaction leaves the span without deliveries: it records the request to enqueue;
- ``postlane.send``, one per attempt, in the worker: its outcome, the provider message id.

Attributes: ``postlane.key`` (the idempotency key), ``postlane.delivery_id``,
``postlane.lane``, and per attempt ``postlane.attempt``, ``postlane.outcome``,
``postlane.provider_message_id``. Never the recipient address.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from postlane.core.message import Delivery, EnqueueResult, Message
from postlane.extras import requires

ENV = "POSTLANE_TRACING"
"""``otel`` turns traces on in ``postlane worker`` and ``postlane serve``."""

_tracer: Any = None  # an opentelemetry Tracer while enabled


def enable(tracer_provider: Any = None) -> None:
    """Trace deliveries through ``tracer_provider`` (default: OpenTelemetry's global one)."""
    global _tracer
    from postlane import __version__

    with requires("otel", "OpenTelemetry traces"):
        from opentelemetry import trace
    provider = tracer_provider or trace.get_tracer_provider()
    _tracer = provider.get_tracer("postlane", __version__)


def enable_from_env() -> bool:
    """``enable`` when ``POSTLANE_TRACING=otel``; True if traces are on."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("", "0", "off", "none"):
        return False
    if value != "otel":
        from postlane.errors import ConfigurationError

        raise ConfigurationError(f"{ENV}={value!r}: the only tracer is 'otel' (or unset)")
    enable()
    return True


def disable() -> None:
    global _tracer
    _tracer = None


def enabled() -> bool:
    return _tracer is not None


def trace_ids(key: str) -> tuple[int, int]:
    """(trace id, root span id) of the delivery with idempotency key ``key``: the same in
    every process, never zero (zero is "invalid" to OpenTelemetry)."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    return (int.from_bytes(digest[:16], "big") or 1), (int.from_bytes(digest[16:24], "big") or 1)


def _parent(key: str) -> Any:
    from opentelemetry import trace

    trace_id, span_id = trace_ids(key)
    root = trace.SpanContext(trace_id, span_id, is_remote=True,
                             trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
    return trace.set_span_in_context(trace.NonRecordingSpan(root))


def enqueued(messages: Sequence[Message], results: Sequence[EnqueueResult]) -> None:
    """A ``postlane.enqueue`` span for each delivery these calls created (a repeat of an
    existing key created nothing, and adds no span)."""
    if _tracer is None:
        return
    from opentelemetry import trace

    current = trace.get_current_span().get_span_context()
    links = [trace.Link(current)] if current.is_valid else []
    for message, result in zip(messages, results, strict=True):
        if not result.created:
            continue
        span = _tracer.start_span(
            "postlane.enqueue", context=_parent(message.key), kind=trace.SpanKind.PRODUCER,
            links=links, attributes={"postlane.key": message.key,
                                     "postlane.delivery_id": result.id,
                                     "postlane.lane": message.lane})
        span.end()


_NO_SPAN: AbstractContextManager[Any] = nullcontext(None)
"""What ``sending`` gives while traces are off: one shared no-op, not a generator per send
(that cost more than a no-op send)."""


def sending(delivery: Delivery) -> AbstractContextManager[Any]:
    """A ``postlane.send`` span around one attempt (None while traces are off); the caller
    records the outcome with ``record_outcome``."""
    return _NO_SPAN if _tracer is None else _sending_span(delivery)


@contextmanager
def _sending_span(delivery: Delivery) -> Iterator[Any]:
    assert _tracer is not None
    from opentelemetry import trace

    with _tracer.start_as_current_span(
            "postlane.send", context=_parent(delivery.key), kind=trace.SpanKind.CLIENT,
            attributes={"postlane.key": delivery.key, "postlane.delivery_id": delivery.id,
                        "postlane.lane": delivery.lane,
                        "postlane.attempt": delivery.attempts + 1}) as span:
        yield span


def record_outcome(span: Any, outcome: str, state: str,
                   provider_message_id: str | None = None) -> None:
    """What the attempt came to, on its ``postlane.send`` span."""
    if span is None:
        return
    span.set_attribute("postlane.outcome", outcome)
    span.set_attribute("postlane.state", state)
    if provider_message_id:
        span.set_attribute("postlane.provider_message_id", provider_message_id)
    if outcome not in ("accepted", "throttled"):
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, outcome))


__all__ = ["ENV", "disable", "enable", "enable_from_env", "enabled", "enqueued",
           "record_outcome", "sending", "trace_ids"]
