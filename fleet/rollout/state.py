"""The rollout's durable record, kept in the rollout ConfigMap (``data["state.json"]``).

Soak times, and the pause / halt transitions that Events report, are measured from here,
never from memory: a restarted or failed-over controller reads the same record. A record
is only ever written after it was observed; losing a write makes the next pass record a
later time, which only lengthens a soak.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from fleet.world.model import format_time, parse_time


@dataclass(frozen=True, slots=True)
class WaveRecord:
    """One wave's rollout of one set of targets (identified by ``fingerprint``)."""

    fingerprint: str
    started_at: datetime | None = None  # first cluster of the wave admitted
    completed_at: datetime | None = None  # every node observed on target and Ready


@dataclass(frozen=True, slots=True)
class Transition:
    """Since when a fleet-wide condition (paused, halted, stopped) holds, and why."""

    since: datetime
    reason: str


@dataclass(frozen=True, slots=True)
class RolloutState:
    waves: Mapping[str, WaveRecord] = field(default_factory=dict)
    paused: Transition | None = None
    halted: Transition | None = None
    stopped: Transition | None = None  # emergency stop
    # Clusters admitted to upgrade ("namespace/name" -> fingerprint of their targets),
    # written before the first dispatch so that a cache lagging behind NodePlans, or a
    # restart, never lets more than maxConcurrentClusters run. Dropped once complete.
    admitted: Mapping[str, str] = field(default_factory=dict)
    # Why the stored record could not be read (not JSON, or not of the record's shape);
    # None for a record that was read (or absent). Never stored: a record with a problem
    # admits nothing new and is not written over (fail closed: its admissions are unknown).
    problem: str | None = field(default=None, compare=False)

    def with_wave(self, name: str, record: WaveRecord) -> RolloutState:
        return replace(self, waves={**self.waves, name: record})

    # -- (de)serialisation ---------------------------------------------------------------
    def to_json(self) -> str:
        def t(x: datetime | None) -> str | None:
            return None if x is None else format_time(x)

        def tr(x: Transition | None) -> dict[str, str] | None:
            return None if x is None else {"since": format_time(x.since), "reason": x.reason}

        return json.dumps({
            "waves": {n: {"fingerprint": w.fingerprint, "startedAt": t(w.started_at),
                          "completedAt": t(w.completed_at)}
                      for n, w in sorted(self.waves.items())},
            "paused": tr(self.paused), "halted": tr(self.halted), "stopped": tr(self.stopped),
            "admitted": dict(sorted(self.admitted.items())),
        }, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> RolloutState:
        """The record stored as ``text`` (absent: an empty one). A record that is not JSON,
        or not of the record's shape, is an empty one with :attr:`problem` set, naming
        what is wrong: its reader admits nothing new and does not write over it."""
        if not text:
            return cls()
        try:
            raw = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            return cls(problem=f"the rollout record is not JSON ({e})")
        if not isinstance(raw, dict):
            return cls(problem=f"the rollout record is a JSON {type(raw).__name__}, not an "
                               "object")
        try:
            return cls._of(raw)
        except (AttributeError, TypeError, ValueError) as e:
            return cls(problem=f"the rollout record is not of the expected shape ({e})")

    @classmethod
    def _of(cls, raw: Mapping[str, Any]) -> RolloutState:
        for key in ("waves", "admitted"):
            if raw.get(key) is not None and not isinstance(raw[key], dict):
                raise ValueError(f"{key} is a {type(raw[key]).__name__}, not an object")

        def tr(x: Any) -> Transition | None:
            if not isinstance(x, dict):
                return None
            since = parse_time(x.get("since"))
            return None if since is None else Transition(since, str(x.get("reason") or ""))

        waves: dict[str, WaveRecord] = {}
        for name, w in (raw.get("waves") or {}).items():
            if isinstance(w, dict) and isinstance(w.get("fingerprint"), str):
                waves[str(name)] = WaveRecord(w["fingerprint"], parse_time(w.get("startedAt")),
                                              parse_time(w.get("completedAt")))
        admitted = raw.get("admitted") or {}
        return cls(waves=waves, paused=tr(raw.get("paused")), halted=tr(raw.get("halted")),
                   stopped=tr(raw.get("stopped")),
                   admitted={str(k): str(v) for k, v in admitted.items()}
                   if isinstance(admitted, dict) else {})
