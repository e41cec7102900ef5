"""fleet.status.runtime: the process, GC and build-info metrics next to the fleet's."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleet import __version__
from fleet.controllers.gcpause import GcPauses
from fleet.status.runtime import register_runtime_metrics
from fleet.status.server import StatusBoard


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return samples(registry)[(name, tuple(sorted(labels.items())))]


def fake_clock(times: list[float]) -> Iterator[float]:
    yield from times


def test_process_gc_and_build_info_are_exported() -> None:
    board = StatusBoard()
    register_runtime_metrics(board.registry, component="controller")
    got = samples(board.registry)
    names = {name for name, _ in got}
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes",
                 "process_virtual_memory_bytes", "process_open_fds", "process_max_fds",
                 "process_start_time_seconds", "python_gc_collections_total",
                 "python_gc_objects_collected_total", "python_gc_objects_uncollectable_total",
                 "python_info", "k0s_fleet_build_info"):
        assert name in names, name
    assert value(board.registry, "k0s_fleet_build_info", version=__version__,
                 component="controller") == 1
    # the fleet's own metrics are still there, in the same registry
    assert "k0s_fleet_rollout_progress_ratio" in names
    # no pause metrics unless something times the collections
    assert not any(n.startswith("python_gc_pause") for n in names)
    # the process is this one: started before now, resident, with its fds counted
    start = value(board.registry, "process_start_time_seconds")
    assert 0 < start <= time.time()
    assert value(board.registry, "process_resident_memory_bytes") > 1 << 20
    before = value(board.registry, "process_open_fds")
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(5)]
    try:
        assert value(board.registry, "process_open_fds") == before + 5
    finally:
        for fd in fds:
            os.close(fd)


def test_gc_pauses_are_exported_per_generation() -> None:
    clock = fake_clock([10.0, 10.25, 20.0, 20.5, 30.0, 30.125])
    pauses = GcPauses(clock=lambda: next(clock), log_over=100)
    registry = CollectorRegistry()
    register_runtime_metrics(registry, component="agent", gc_pauses=pauses, version="9.9.9")
    for gen in (2, 2, 0):
        pauses("start", {"generation": gen})
        pauses("stop", {"generation": gen, "collected": 0})
    assert value(registry, "python_gc_pause_seconds_total", generation="2") == 0.75
    assert value(registry, "python_gc_pause_seconds_total", generation="0") == 0.125
    assert value(registry, "python_gc_pause_seconds_total", generation="1") == 0
    assert value(registry, "python_gc_pause_max_seconds", generation="2") == 0.5
    assert value(registry, "python_gc_pause_max_seconds", generation="0") == 0.125
    assert value(registry, "k0s_fleet_build_info", version="9.9.9", component="agent") == 1
    assert pauses.seconds == 0.875
