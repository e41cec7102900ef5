"""The process's own metrics next to the fleet's: ``process_*`` (CPU seconds, resident and
virtual memory, open and maximum file descriptors, start time; Linux ``/proc``),
``python_gc_*`` (collections, objects collected and uncollectable per generation, as
prometheus_client exports them, plus the time the collections stopped the process when a
:class:`~fleet.controllers.gcpause.GcPauses` is timing them), ``python_info`` and
``k0s_fleet_build_info{version,component}``.

Registered into the registry given (never the global one), so tests and several
components in one process can each have their own.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleet import __version__
from fleet.controllers.gcpause import GcPauses

BUILD_INFO = "k0s_fleet_build_info"
GC_PAUSE_SECONDS = "python_gc_pause_seconds"  # a counter: exported with _total
GC_PAUSE_MAX_SECONDS = "python_gc_pause_max_seconds"


class GcPauseCollector(Collector):
    """How long garbage collections stopped the process, per generation: the total (a
    counter) and the longest one seen (a gauge), read from ``pauses`` at scrape time."""

    def __init__(self, pauses: GcPauses) -> None:
        self.pauses = pauses

    def collect(self) -> Iterator[Metric]:
        total = CounterMetricFamily(
            GC_PAUSE_SECONDS, "Time garbage collections of this generation stopped the "
            "process (its event loop included).", labels=["generation"])
        longest = GaugeMetricFamily(
            GC_PAUSE_MAX_SECONDS, "The longest garbage collection of this generation since "
            "the process started.", labels=["generation"])
        for gen in range(3):
            total.add_metric([str(gen)], self.pauses.paused[gen])
            longest.add_metric([str(gen)], self.pauses.longest[gen])
        yield total
        yield longest


def register_runtime_metrics(registry: CollectorRegistry, *, component: str,
                             gc_pauses: GcPauses | None = None,
                             version: str = __version__) -> None:
    """Add the process, GC, platform and build-info metrics to ``registry``.

    ``component``: which k0s-fleet process this is (``controller``, ``agent``), a label of
    ``k0s_fleet_build_info``."""
    ProcessCollector(registry=registry)
    GCCollector(registry=registry)
    PlatformCollector(registry=registry)
    if gc_pauses is not None:
        registry.register(GcPauseCollector(gc_pauses))
    Gauge(BUILD_INFO, "1, labelled with the running k0s-fleet's version and component.",
          ["version", "component"], registry=registry).labels(version, component).set(1)
