"""Tracing: a TracerProvider built from the fleet's telemetry settings, a JSON-lines span
file, and W3C ``traceparent`` helpers for carrying trace context on Kubernetes objects.

Nothing here touches global OpenTelemetry state unless asked (``set_global=True``), so
tests can build as many providers as they like.

Objects carry a traceparent in the annotation :data:`TRACEPARENT_ANNOTATION`; a
reconcile starts its own span *linked* to that context (a link, not a parent: one
reconcile serves many requests, and a request outlives many reconciles).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from os import PathLike, fspath
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Link, SpanContext
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes

from fleet import __version__
from fleet.config import TelemetrySettings

log = logging.getLogger(__name__)

TRACEPARENT_ANNOTATION = "tracing.k8s.io/traceparent"
# W3C version 00 is 55 characters; later versions may append fields. Anything much
# longer is not a traceparent and is not worth parsing.
_MAX_TRACEPARENT = 512
_PROPAGATOR = TraceContextTextMapPropagator()


class JsonLinesSpanExporter(SpanExporter):
    """Appends one JSON object per finished span to a file.

    Each line: ``name, kind, trace_id, span_id, parent_span_id, links, attributes,
    events, start_time_unix_nano, end_time_unix_nano, status, scope, resource`` with ids
    in lowercase hex (as in a traceparent).
    """

    def __init__(self, path: str | PathLike[str]) -> None:
        self.path = Path(fspath(path))
        self._lock = threading.Lock()
        self._closed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        lines = "".join(json.dumps(span_to_dict(s), separators=(",", ":")) + "\n" for s in spans)
        try:
            with self._lock:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a", encoding="utf-8") as fh:
                    fh.write(lines)
        except OSError as e:
            log.warning("cannot write spans to %s: %s", self.path, e)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._closed = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # every export is written through


def _hex_trace(trace_id: int) -> str:
    return f"{trace_id:032x}"


def _hex_span(span_id: int) -> str:
    return f"{span_id:016x}"


def _attrs(attributes: Attributes | None) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in (attributes or {}).items()}


def span_to_dict(span: ReadableSpan) -> dict[str, Any]:
    """The JSON-lines record of a finished span."""
    ctx = span.get_span_context()
    parent = span.parent
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": _hex_trace(ctx.trace_id) if ctx else None,
        "span_id": _hex_span(ctx.span_id) if ctx else None,
        "parent_span_id": _hex_span(parent.span_id) if parent else None,
        "links": [
            {
                "trace_id": _hex_trace(link.context.trace_id),
                "span_id": _hex_span(link.context.span_id),
                "attributes": _attrs(link.attributes),
            }
            for link in span.links
        ],
        "attributes": _attrs(span.attributes),
        "events": [
            {"name": e.name, "time_unix_nano": e.timestamp, "attributes": _attrs(e.attributes)}
            for e in span.events
        ],
        "start_time_unix_nano": span.start_time,
        "end_time_unix_nano": span.end_time,
        "status": {"code": span.status.status_code.name, "description": span.status.description},
        "scope": span.instrumentation_scope.name if span.instrumentation_scope else None,
        "resource": _attrs(span.resource.attributes),
    }


def otlp_traces_endpoint(endpoint: str) -> str:
    """The OTLP/HTTP traces URL for a configured endpoint: a bare collector address
    (``http://collector:4318``) gets the standard ``/v1/traces`` path; a URL with a path
    is used as given."""
    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        return urlunsplit(parts._replace(path="/v1/traces"))
    return endpoint


def setup_tracing(
    settings: TelemetrySettings,
    *,
    extra_exporters: Sequence[SpanExporter] = (),
    resource_attributes: Mapping[str, str] | None = None,
    set_global: bool = False,
) -> TracerProvider:
    """A TracerProvider for ``settings``: service name, parent-based ratio sampling, an
    OTLP/HTTP exporter when ``otlpEndpoint`` is set and a JSON-lines file exporter when
    ``traceFile`` is set (both batched). ``extra_exporters`` (e.g. an in-memory exporter
    in tests) are attached synchronously. The caller owns the provider: call
    ``shutdown()`` on exit to flush. With ``set_global`` it also becomes the global
    provider (once per process; OpenTelemetry ignores later attempts).
    """
    resource = Resource.create(
        {
            "service.name": settings.service_name,
            "service.version": __version__,
            **(resource_attributes or {}),
        }
    )
    provider = TracerProvider(
        resource=resource, sampler=ParentBased(TraceIdRatioBased(settings.sampling_ratio))
    )
    if settings.otlp_endpoint:
        # Imported here: it pulls in requests and protobuf, which most processes never need.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )

        provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=otlp_traces_endpoint(settings.otlp_endpoint))
            )
        )
    if settings.trace_file:
        provider.add_span_processor(BatchSpanProcessor(JsonLinesSpanExporter(settings.trace_file)))
    for exporter in extra_exporters:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    if set_global:
        trace.set_tracer_provider(provider)
    return provider


def get_tracer(name: str, provider: trace.TracerProvider | None = None) -> trace.Tracer:
    """A tracer from ``provider``, or from the global provider when none is given."""
    if provider is not None:
        return provider.get_tracer(name, __version__)
    return trace.get_tracer(name, __version__)


def current_traceparent(context: Context | None = None) -> str | None:
    """The W3C traceparent of the current span (or of ``context``); ``None`` when there
    is no valid span."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=context)
    return carrier.get("traceparent")


def _span_context(traceparent: object) -> tuple[Context, SpanContext] | None:
    if not isinstance(traceparent, str) or len(traceparent) > _MAX_TRACEPARENT:
        return None
    try:
        ctx = _PROPAGATOR.extract({"traceparent": traceparent.strip()})
        span_ctx = trace.get_current_span(ctx).get_span_context()
    except Exception:  # a malformed header must never break a reconcile
        return None
    if not span_ctx.is_valid:
        return None
    return ctx, span_ctx


def context_from_traceparent(traceparent: object) -> Context | None:
    """An OpenTelemetry Context whose (remote) parent is ``traceparent``, or ``None`` when
    it is missing or malformed. Never raises."""
    found = _span_context(traceparent)
    return found[0] if found else None


def link_from_traceparent(traceparent: object, attributes: Attributes = None) -> Link | None:
    """A span Link to ``traceparent``, or ``None`` when it is missing or malformed.
    Never raises."""
    found = _span_context(traceparent)
    return Link(found[1], attributes) if found else None


__all__ = [
    "TRACEPARENT_ANNOTATION",
    "JsonLinesSpanExporter",
    "context_from_traceparent",
    "current_traceparent",
    "get_tracer",
    "link_from_traceparent",
    "otlp_traces_endpoint",
    "setup_tracing",
    "span_to_dict",
]
