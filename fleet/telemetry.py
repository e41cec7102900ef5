"""Tracing: a TracerProvider built from the fleet's telemetry settings, a JSON-lines span
file, and W3C ``traceparent`` helpers for carrying trace context on Kubernetes objects.

Nothing here touches global OpenTelemetry state unless asked (``set_global=True``), so
tests can build as many providers as they like.

The standard OpenTelemetry environment is honoured (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``/``_ARG``, ``OTEL_EXPORTER_OTLP_*``
including headers, certificate, timeout and compression, ``OTEL_TRACES_EXPORTER=none``,
``OTEL_SDK_DISABLED``); an explicitly configured value (fleet YAML, agent flag) wins
where both are set (:func:`setup_tracing`).

Objects carry a traceparent in the annotation :data:`TRACEPARENT_ANNOTATION`; a
reconcile starts its own span *linked* to that context (a link, not a parent: one
reconcile serves many requests, and a request outlives many reconciles).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from os import PathLike, fspath
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.util.types import Attributes

from fleet import __version__
from fleet.contract.tracecontext import (
    _PRESET,
    TRACEPARENT_ANNOTATION,
    DurableSpan,
    TracingOptions,
    TracingSettings,
    context_from_traceparent,
    current_traceparent,
    get_tracer,
    link_from_traceparent,
    otlp_from_environment,
    resolved_service_name,
    tracing_wanted,
)

log = logging.getLogger(__name__)



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


class _PresetIdGenerator(RandomIdGenerator):
    """Random ids, except for a span started by :func:`start_span_with_id`."""

    def generate_span_id(self) -> int:
        preset = _PRESET.get()
        return preset[1] if preset is not None else super().generate_span_id()

    def generate_trace_id(self) -> int:
        preset = _PRESET.get()
        return preset[0] if preset is not None else super().generate_trace_id()


def setup_tracing(
    settings: TracingSettings,
    *,
    default_service_name: str = "k0s-fleet",
    extra_exporters: Sequence[SpanExporter] = (),
    resource_attributes: Mapping[str, str] | None = None,
    set_global: bool = False,
) -> TracerProvider:
    """A TracerProvider for ``settings``; configured values win over the environment.

    - ``service.name``: ``settings.service_name`` > ``OTEL_SERVICE_NAME`` >
      ``default_service_name``; other resource attributes: ``resource_attributes`` >
      ``OTEL_RESOURCE_ATTRIBUTES``.
    - Sampling: ``settings.sampling_ratio`` (parent-based ratio) > ``OTEL_TRACES_SAMPLER``
      (and ``_ARG``) > parent-based always-on.
    - OTLP/HTTP export (batched): to ``settings.otlp_endpoint`` when set (other
      ``OTEL_EXPORTER_OTLP_*`` settings such as headers still apply), else wherever
      ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`` points; none with
      ``OTEL_TRACES_EXPORTER=none`` or ``OTEL_SDK_DISABLED=true`` unless configured.
    - A JSON-lines file (batched) when ``settings.trace_file`` is set.

    ``extra_exporters`` (e.g. an in-memory exporter in tests) are attached synchronously.
    The caller owns the provider: call ``shutdown()`` on exit to flush. With
    ``set_global`` it also becomes the global provider (once per process).
    """
    resource = Resource.create(
        {
            **(resource_attributes or {}),
            "service.name": resolved_service_name(settings, default_service_name),
            "service.version": __version__,
        }
    )
    sampler: Sampler | None = None  # None: the SDK reads OTEL_TRACES_SAMPLER
    if settings.sampling_ratio is not None:
        sampler = ParentBased(TraceIdRatioBased(settings.sampling_ratio))
    provider = TracerProvider(resource=resource, sampler=sampler,
                              id_generator=_PresetIdGenerator())
    if settings.otlp_endpoint or otlp_from_environment():
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or \
            os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        if protocol and protocol != "http/protobuf":
            log.warning("OTLP protocol %r is not supported; exporting with http/protobuf",
                        protocol)
        # Imported here: it pulls in requests and protobuf, which most processes never need.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )

        endpoint = otlp_traces_endpoint(settings.otlp_endpoint) \
            if settings.otlp_endpoint else None  # None: the exporter reads the environment
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    if settings.trace_file:
        provider.add_span_processor(BatchSpanProcessor(JsonLinesSpanExporter(settings.trace_file)))
    for exporter in extra_exporters:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    if set_global:
        trace.set_tracer_provider(provider)
    return provider



__all__ = [
    "TRACEPARENT_ANNOTATION",
    "DurableSpan",
    "JsonLinesSpanExporter",
    "TracingOptions",
    "TracingSettings",
    "context_from_traceparent",
    "current_traceparent",
    "get_tracer",
    "link_from_traceparent",
    "otlp_from_environment",
    "otlp_traces_endpoint",
    "resolved_service_name",
    "setup_tracing",
    "span_to_dict",
    "tracing_wanted",
]
