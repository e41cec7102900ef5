"""A real trace backend for the test world: Jaeger v2 (``cmd/jaeger``, built from the Go
module proxy by hack/testenv/build.sh) with its OTLP/HTTP receiver and in-memory storage,
on loopback ports; traces are read back through its query API (``/api/traces/<id>``).

Use ``with Jaeger(workdir) as j`` (or ``start()``/``stop()``); point exporters at
``j.otlp_endpoint``; ``await j.wait_for_trace(trace_id, predicate)``.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from fleet.testing.binaries import binary
from fleet.testing.world import free_port, kill_group, wait_tcp


@dataclass(frozen=True)
class TraceSpan:
    """One span as Jaeger's query API returns it, flattened."""

    name: str
    span_id: str
    parent_id: str | None
    service: str
    instance: str
    tags: dict[str, Any]
    start_us: int
    duration_us: int

    @property
    def error(self) -> bool:
        return self.tags.get("otel.status_code") == "ERROR" or self.tags.get("error") is True


def spans_of(trace: dict[str, Any]) -> list[TraceSpan]:
    processes = trace.get("processes") or {}
    out = []
    for s in trace.get("spans") or []:
        proc = processes.get(s.get("processID")) or {}
        ptags = {t["key"]: t["value"] for t in proc.get("tags") or []}
        parents = [r["spanID"] for r in s.get("references") or []
                   if r.get("refType") == "CHILD_OF"]
        out.append(TraceSpan(
            name=s["operationName"], span_id=s["spanID"],
            parent_id=parents[0] if parents else None,
            service=str(proc.get("serviceName")),
            instance=str(ptags.get("service.instance.id", "")),
            tags={t["key"]: t["value"] for t in s.get("tags") or []},
            start_us=int(s["startTime"]), duration_us=int(s["duration"])))
    return out


@dataclass
class Jaeger:
    workdir: Path
    otlp_port: int = field(default_factory=free_port)
    query_port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def otlp_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.otlp_port}"

    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.query_port}"

    def trace_link(self, trace_id: str) -> str:
        return f"{self.query_url}/trace/{trace_id}"

    def config(self) -> str:
        # Only what the tests need: OTLP/HTTP in, memory storage, the query API, health.
        return json.dumps({
            "service": {
                "extensions": ["jaeger_storage", "jaeger_query", "healthcheckv2"],
                "pipelines": {"traces": {"receivers": ["otlp"], "processors": ["batch"],
                                         "exporters": ["jaeger_storage_exporter"]}},
                "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}},
            },
            "extensions": {
                "jaeger_storage": {"backends": {"mem": {"memory": {"max_traces": 100000}}}},
                "jaeger_query": {"storage": {"traces": "mem"},
                                 "http": {"endpoint": f"127.0.0.1:{self.query_port}"},
                                 "grpc": {"endpoint": f"127.0.0.1:{self.grpc_port}"}},
                "healthcheckv2": {"use_v2": True,
                                  "http": {"endpoint": f"127.0.0.1:{self.health_port}"}},
            },
            "receivers": {"otlp": {"protocols": {
                "http": {"endpoint": f"127.0.0.1:{self.otlp_port}"}}}},
            "processors": {"batch": {"timeout": "100ms"}},
            "exporters": {"jaeger_storage_exporter": {"trace_storage": "mem"}},
        }, indent=1)

    def start(self) -> Jaeger:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / "jaeger.yaml"  # JSON is YAML
        cfg.write_text(self.config())
        logf = open(self.workdir / "jaeger.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen([str(binary("jaeger")), "--config", f"file:{cfg}"],
                                     stdout=logf, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        logf.close()
        for port in (self.health_port, self.otlp_port, self.query_port):
            wait_tcp(port, self.proc, "jaeger", 60)
        return self

    def stop(self) -> None:
        kill_group(self.proc)

    def __enter__(self) -> Jaeger:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def get_trace(self, trace_id: str) -> dict[str, Any] | None:
        """The trace as the query API returns it, or None while Jaeger has none of it."""
        try:
            with urllib.request.urlopen(f"{self.query_url}/api/traces/{trace_id}",
                                        timeout=10) as resp:
                data = json.loads(resp.read())
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise
        traces = data.get("data") or []
        return traces[0] if traces else None

    async def wait_for_trace(self, trace_id: str,
                             done: Callable[[list[TraceSpan]], bool],
                             timeout: float = 60.0) -> list[TraceSpan]:
        """Poll the query API until ``done(spans)`` (generous deadline; exporters batch)."""
        deadline = time.monotonic() + timeout
        spans: list[TraceSpan] = []
        while True:
            trace = await anyio.to_thread.run_sync(self.get_trace, trace_id)
            spans = spans_of(trace) if trace else []
            if done(spans):
                return spans
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"trace {trace_id} incomplete after {timeout}s: "
                    f"{sorted((s.service, s.name) for s in spans)}")
            await anyio.sleep(0.2)
