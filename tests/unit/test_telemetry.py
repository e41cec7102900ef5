"""Tracing setup, the JSON-lines span file and W3C traceparent helpers (no global state)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from fleet.config.models import TelemetrySettings
from fleet.telemetry import (
    DurableSpan,
    TracingOptions,
    context_from_traceparent,
    current_traceparent,
    get_tracer,
    link_from_traceparent,
    otlp_from_environment,
    otlp_traces_endpoint,
    resolved_service_name,
    setup_tracing,
    tracing_wanted,
)

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_link_carries_the_trace_id_of_the_producing_span() -> None:
    memory = InMemorySpanExporter()
    provider = setup_tracing(TelemetrySettings(), extra_exporters=[memory])
    tracer = get_tracer("test", provider)
    try:
        with tracer.start_as_current_span("request") as request:
            tp = current_traceparent()
        assert tp is not None
        link = link_from_traceparent(tp, {"k0s-fleet.link": "request"})
        assert link is not None
        with tracer.start_as_current_span("reconcile", links=[link]) as reconcile:
            pass
        req_ctx = request.get_span_context()
        rec_ctx = reconcile.get_span_context()
        # A link, not a parent: the reconcile is its own trace pointing at the request.
        assert rec_ctx.trace_id != req_ctx.trace_id
        finished = {s.name: s for s in memory.get_finished_spans()}
        assert finished["reconcile"].parent is None
        (stored,) = finished["reconcile"].links
        assert stored.context.trace_id == req_ctx.trace_id
        assert stored.context.span_id == req_ctx.span_id
        assert dict(stored.attributes or {}) == {"k0s-fleet.link": "request"}
    finally:
        provider.shutdown()


def test_context_from_traceparent_makes_a_remote_parent() -> None:
    memory = InMemorySpanExporter()
    provider = setup_tracing(TelemetrySettings(), extra_exporters=[memory])
    try:
        ctx = context_from_traceparent(VALID)
        assert ctx is not None
        with get_tracer("test", provider).start_as_current_span("child", context=ctx) as child:
            assert current_traceparent() == (
                f"00-4bf92f3577b34da6a3ce929d0e0e4736-{child.get_span_context().span_id:016x}-01"
            )
        (span,) = memory.get_finished_spans()
        assert span.parent is not None
        assert f"{span.parent.span_id:016x}" == "00f067aa0ba902b7"
        assert span.parent.is_remote
    finally:
        provider.shutdown()


def test_current_traceparent_without_a_span() -> None:
    assert current_traceparent() is None


@pytest.mark.parametrize(
    "garbage",
    [
        None,
        "",
        "   ",
        "garbage",
        42,
        b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero span id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # forbidden version
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # short trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" + "-x" * 300,
    ],
)
def test_garbage_traceparent_gives_none(garbage: object) -> None:
    assert context_from_traceparent(garbage) is None
    assert link_from_traceparent(garbage) is None


@given(st.text(max_size=80))
def test_traceparent_helpers_never_raise(text: str) -> None:
    ctx = context_from_traceparent(text)
    link = link_from_traceparent(text)
    assert (ctx is None) == (link is None)


def test_json_lines_file(tmp_path: Path) -> None:
    path = tmp_path / "traces" / "spans.jsonl"
    provider = setup_tracing(
        TelemetrySettings(trace_file=str(path), service_name="fleet-test"),
        resource_attributes={"k8s.cluster.name": "mgmt"},
    )
    tracer = get_tracer("test", provider)
    link = link_from_traceparent(VALID)
    assert link is not None
    with tracer.start_as_current_span("parent", links=[link]) as parent:
        parent.set_attribute("k0s.version", "v1.31.3+k0s.0")
        parent.set_attribute("nodes", ["a", "b"])
        with tracer.start_as_current_span("child") as child:
            child.add_event("drained", {"pods": 3})
            child.set_status(StatusCode.ERROR, "drain timed out")
    provider.force_flush()
    provider.shutdown()

    lines = path.read_text().splitlines()
    records = {r["name"]: r for r in map(json.loads, lines)}
    assert len(lines) == 2
    p, c = records["parent"], records["child"]
    pctx, cctx = parent.get_span_context(), child.get_span_context()
    assert p["trace_id"] == c["trace_id"] == f"{pctx.trace_id:032x}"
    assert p["span_id"] == f"{pctx.span_id:016x}"
    assert c["span_id"] == f"{cctx.span_id:016x}"
    assert p["parent_span_id"] is None
    assert c["parent_span_id"] == p["span_id"]
    assert p["links"] == [
        {
            "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
            "span_id": "00f067aa0ba902b7",
            "attributes": {},
        }
    ]
    assert p["attributes"] == {"k0s.version": "v1.31.3+k0s.0", "nodes": ["a", "b"]}
    assert c["events"][0]["name"] == "drained"
    assert c["events"][0]["attributes"] == {"pods": 3}
    assert c["status"] == {"code": "ERROR", "description": "drain timed out"}
    assert p["status"]["code"] == "UNSET"
    assert 0 < p["start_time_unix_nano"] <= c["start_time_unix_nano"]
    assert c["end_time_unix_nano"] <= p["end_time_unix_nano"]
    assert p["resource"]["service.name"] == "fleet-test"
    assert p["resource"]["k8s.cluster.name"] == "mgmt"
    assert p["scope"] == "test"


def test_file_exporter_appends(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    for name in ("first", "second"):
        provider = setup_tracing(TelemetrySettings(trace_file=str(path)))
        with get_tracer("test", provider).start_as_current_span(name):
            pass
        provider.shutdown()
    assert [json.loads(line)["name"] for line in path.read_text().splitlines()] == [
        "first",
        "second",
    ]


def test_sampling_ratio_zero_records_no_new_traces_but_follows_sampled_parents() -> None:
    memory = InMemorySpanExporter()
    provider = setup_tracing(TelemetrySettings(sampling_ratio=0.0), extra_exporters=[memory])
    tracer = get_tracer("test", provider)
    try:
        with tracer.start_as_current_span("root") as root:
            assert not root.is_recording()
        with tracer.start_as_current_span("child", context=context_from_traceparent(VALID)) as c:
            assert c.is_recording()  # the remote parent was sampled (flags 01)
        assert [s.name for s in memory.get_finished_spans()] == ["child"]
    finally:
        provider.shutdown()


def test_provider_is_not_installed_globally_unless_asked() -> None:
    before = trace.get_tracer_provider()
    provider = setup_tracing(TelemetrySettings(service_name="local-only"))
    try:
        assert trace.get_tracer_provider() is before
        assert provider.resource.attributes["service.name"] == "local-only"
    finally:
        provider.shutdown()


class _Collector:
    """A loopback OTLP/HTTP receiver: records (path, headers, body) of every POST."""

    def __init__(self) -> None:
        received = self.received = []  # type: list[tuple[str, dict[str, str], bytes]]

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                received.append((self.path, dict(self.headers.items()), body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def collectors() -> Iterator[tuple[_Collector, _Collector]]:
    a, b = _Collector(), _Collector()
    yield a, b
    a.close()
    b.close()


def _export_one(settings: TracingOptions | TelemetrySettings) -> TracerProvider:
    provider = setup_tracing(settings)
    with get_tracer("test", provider).start_as_current_span("one"):
        pass
    assert provider.force_flush(10_000)
    provider.shutdown()
    return provider


def test_otlp_export_follows_the_standard_environment(
        monkeypatch: pytest.MonkeyPatch, collectors: tuple[_Collector, _Collector]) -> None:
    env_collector, _ = collectors
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", env_collector.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=fleet")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
    assert tracing_wanted(TracingOptions())
    provider = _export_one(TracingOptions())
    assert provider.resource.attributes["service.name"] == "from-env"
    assert provider.resource.attributes["deployment.environment"] == "test"
    [(path, headers, body)] = env_collector.received
    assert path == "/v1/traces" and body
    assert {k.lower(): v for k, v in headers.items()}["x-tenant"] == "fleet"
    assert b"from-env" in body  # the resource travels in the protobuf payload


def test_configured_values_win_over_the_environment(
        monkeypatch: pytest.MonkeyPatch, collectors: tuple[_Collector, _Collector]) -> None:
    env_collector, configured = collectors
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", env_collector.url)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    provider = _export_one(TelemetrySettings(otlp_endpoint=configured.url,
                                             service_name="from-config", sampling_ratio=1.0))
    assert provider.resource.attributes["service.name"] == "from-config"
    assert env_collector.received == []
    [(path, _, body)] = configured.received
    assert path == "/v1/traces" and b"from-config" in body


def test_the_environment_sampler_applies_when_no_ratio_is_configured(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    memory = InMemorySpanExporter()
    provider = setup_tracing(TracingOptions(), extra_exporters=[memory])
    with get_tracer("test", provider).start_as_current_span("dropped") as span:
        assert not span.is_recording()
    provider.shutdown()
    assert memory.get_finished_spans() == ()


@pytest.mark.parametrize(("env", "wanted"), [
    ({}, False),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, False),
])
def test_otlp_from_environment(env: dict[str, str], wanted: bool) -> None:
    assert otlp_from_environment(env) is wanted


def test_the_configured_service_name_beats_the_environment_which_beats_the_default() -> None:
    env = {"OTEL_SERVICE_NAME": "env"}
    assert resolved_service_name(TracingOptions(service_name="cfg"), "dflt", env) == "cfg"
    assert resolved_service_name(TracingOptions(), "dflt", env) == "env"
    assert resolved_service_name(TracingOptions(), "dflt", {}) == "dflt"


def test_durable_span_ids_are_the_same_in_every_process() -> None:
    """Two 'processes' (providers) deriving the upgrade span of one request agree, and
    children started under it in either are its children; the span itself gets the id."""
    a, b = DurableSpan.derive("req-1", VALID), DurableSpan.derive("req-1", VALID)
    assert (a.trace_id, a.span_id) == (b.trace_id, b.span_id)
    assert f"{a.trace_id:032x}" == VALID.split("-")[1]
    assert DurableSpan.derive("req-2", VALID).span_id != a.span_id
    memory = InMemorySpanExporter()
    provider = setup_tracing(TracingOptions(), extra_exporters=[memory])
    tracer = get_tracer("test", provider)
    with tracer.start_as_current_span("step", context=b.child_context()):
        pass
    a.start(tracer, "upgrade").end()
    provider.shutdown()
    spans = {s.name: s for s in memory.get_finished_spans()}
    up, step = spans["upgrade"], spans["step"]
    assert up.context is not None and step.parent is not None and up.parent is not None
    assert up.context.span_id == a.span_id and step.parent.span_id == a.span_id
    assert up.parent.span_id == int(VALID.split("-")[2], 16)
    root = DurableSpan.derive("req-3", None)  # no traceparent: a root of its own
    assert root.parent is None and root.trace_id == DurableSpan.derive("req-3", "").trace_id


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("http://collector:4318", "http://collector:4318/v1/traces"),
        ("http://collector:4318/", "http://collector:4318/v1/traces"),
        ("https://otel.example.com/custom/path", "https://otel.example.com/custom/path"),
    ],
)
def test_otlp_traces_endpoint(endpoint: str, url: str) -> None:
    assert otlp_traces_endpoint(endpoint) == url
