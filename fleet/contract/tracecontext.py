"""W3C trace context on Kubernetes objects and node signals, with the OpenTelemetry API only.

Kept apart from :mod:`fleet.telemetry` (which builds SDK providers and exporters) so that
a process that only propagates context (the node agent without an exporter) does not
import the SDK.
"""

from __future__ import annotations

import contextvars
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes

from fleet import __version__

TRACEPARENT_ANNOTATION = "tracing.k8s.io/traceparent"
# W3C version 00 is 55 characters; later versions may append fields. Anything much
# longer is not a traceparent and is not worth parsing.
_MAX_TRACEPARENT = 512
_PROPAGATOR = TraceContextTextMapPropagator()


# -- spans whose identity is known in advance -------------------------------------------------
# A node upgrade outlives agent processes: its span's id is derived from the request, so
# that every process's step spans name the same parent, and whichever process sees the
# request end records the span itself with exactly that id.
_PRESET: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "fleet_preset_ids", default=None)


def _derived(seed: str, bits: int) -> int:
    value = int.from_bytes(hashlib.sha256(seed.encode()).digest()[:bits // 8], "big")
    return value or 1


@dataclass(frozen=True, slots=True)
class DurableSpan:
    """The identity of a span that several processes contribute children to.

    ``parent`` is the remote parent (from a traceparent) or None for a root; the trace
    id is the parent's, or derived from ``seed`` for a root.
    """

    trace_id: int
    span_id: int
    parent: Context | None
    sampled: bool

    @classmethod
    def derive(cls, seed: str, traceparent: object) -> DurableSpan:
        found = _span_context(traceparent)
        if found is not None:
            ctx, parent = found
            return cls(parent.trace_id, _derived(f"span|{seed}|{parent.trace_id:032x}", 64),
                       ctx, parent.trace_flags.sampled)
        return cls(_derived(f"trace|{seed}", 128), _derived(f"span|{seed}|", 64), None, True)

    def child_context(self) -> Context:
        """A context whose current span is this one: children started in it are its."""
        flags = TraceFlags(TraceFlags.SAMPLED if self.sampled else TraceFlags.DEFAULT)
        return trace.set_span_in_context(NonRecordingSpan(SpanContext(
            self.trace_id, self.span_id, is_remote=True, trace_flags=flags)))

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{'01' if self.sampled else '00'}"

    def start(self, tracer: trace.Tracer, name: str, *, start_time: int | None = None,
              attributes: Attributes = None) -> Span:
        """Start the span itself (once, by whoever ends it). With a provider from
        :func:`setup_tracing` it gets exactly this identity; other providers assign
        their own ids."""
        token = _PRESET.set((self.trace_id, self.span_id))
        try:
            return tracer.start_span(name, context=self.parent or Context(),
                                     start_time=start_time, attributes=attributes)
        finally:
            _PRESET.reset(token)



# OpenTelemetry semantic conventions (the Kubernetes resource attributes), set on the spans
# of a node upgrade next to k0s-fleet's own ``k0s_fleet.*`` names.
K8S_CLUSTER_NAME = "k8s.cluster.name"
K8S_NAMESPACE_NAME = "k8s.namespace.name"
K8S_NODE_NAME = "k8s.node.name"


def k8s_attributes(namespace: str | None, cluster: str | None,
                   node: str | None) -> dict[str, str]:
    """``k8s.namespace.name`` (of the Cluster API Cluster in the management cluster),
    ``k8s.cluster.name`` (the workload cluster, as Cluster API names it) and
    ``k8s.node.name``, leaving out those not known."""
    pairs = ((K8S_NAMESPACE_NAME, namespace), (K8S_CLUSTER_NAME, cluster),
             (K8S_NODE_NAME, node))
    return {k: v for k, v in pairs if v}


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


# -- where spans go: configuration first, then the standard OTEL_* environment -----------
class TracingSettings(Protocol):
    """What :func:`setup_tracing` reads (``fleet.config.models.TelemetrySettings`` has it);
    ``None`` means "not configured here": the OTEL_* environment, then a default."""

    @property
    def otlp_endpoint(self) -> str | None: ...
    @property
    def service_name(self) -> str | None: ...
    @property
    def sampling_ratio(self) -> float | None: ...
    @property
    def trace_file(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class TracingOptions:
    """TracingSettings for processes that do not load the fleet YAML (the agent)."""

    otlp_endpoint: str | None = None
    service_name: str | None = None
    sampling_ratio: float | None = None
    trace_file: str | None = None


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def otlp_from_environment(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the OTEL_* environment asks for OTLP export of traces."""
    env = os.environ if environ is None else environ
    if _truthy(env.get("OTEL_SDK_DISABLED")):
        return False
    exporters = {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",")}
    if "none" in exporters:
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")) or "otlp" in exporters


def tracing_wanted(settings: TracingSettings, environ: Mapping[str, str] | None = None) -> bool:
    """Whether there is anywhere to send spans (configured, or from the environment)."""
    return bool(settings.otlp_endpoint or settings.trace_file
                or otlp_from_environment(environ))


def resolved_service_name(settings: TracingSettings, default: str,
                          environ: Mapping[str, str] | None = None) -> str:
    """The configured name > OTEL_SERVICE_NAME > ``default``."""
    env = os.environ if environ is None else environ
    return settings.service_name or env.get("OTEL_SERVICE_NAME", "").strip() or default
