"""Two controllers never act at once: judged from the management server's audit log.

Every controller replica of a trial authenticates as its own user (``ctl-N``), so the
API server's audit log says who wrote what, and when the server *received* it. The
Lease writes (create/update of the leader Lease that succeeded) give the holder at every
instant on the server's own clock. A write by a replica received after another replica's
successful Lease write, and before its own next one, was made by a replica that had lost
the Lease: two leaders acting at once. (A write received before the takeover is the old
leader's last act and is fine, even if it completes later.)
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from fleet.world.model import parse_time

WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass(frozen=True, slots=True)
class Write:
    user: str
    verb: str
    resource: str  # "nodeplans/status", "leases", ...
    name: str
    received: datetime
    completed: datetime
    code: int


def writes(lines: Iterable[str], *, user_prefix: str) -> list[Write]:
    """Completed write requests of users named ``user_prefix*``, in order received."""
    out: list[Write] = []
    for line in lines:
        if not line.strip():
            continue
        e = json.loads(line)
        user = str((e.get("user") or {}).get("username") or "")
        if e.get("stage") != "ResponseComplete" or e.get("verb") not in WRITES \
                or not user.startswith(user_prefix):
            continue
        ref = e.get("objectRef") or {}
        resource = str(ref.get("resource") or "") + (
            f"/{ref['subresource']}" if ref.get("subresource") else "")
        received = parse_time(e.get("requestReceivedTimestamp"))
        completed = parse_time(e.get("stageTimestamp"))
        if received is None or completed is None:
            continue
        out.append(Write(user, str(e["verb"]), resource, str(ref.get("name") or ""),
                         received, completed,
                         int((e.get("responseStatus") or {}).get("code") or 0)))
    return sorted(out, key=lambda w: w.received)


def two_leaders(ws: list[Write], *, lease: str) -> list[str]:
    """Writes made by a replica that was not the last to write the Lease successfully."""
    takes = sorted((w for w in ws if w.resource == "leases" and w.name == lease
                    and w.code < 300), key=lambda w: w.completed)
    out: list[str] = []
    for w in ws:
        if w.resource == "leases":
            continue
        holder = None
        for t in takes:
            if t.completed > w.received:
                break
            holder = t.user
        if holder is not None and holder != w.user:
            out.append(f"{w.user} wrote {w.verb} {w.resource} {w.name} (HTTP {w.code}) at "
                       f"{w.received.isoformat()} after {holder} had taken the Lease")
    return out


def check_audit_log(path: Path, *, lease: str, user_prefix: str) -> list[str]:
    try:
        text = path.read_text()
    except OSError as e:
        return [f"audit log {path}: {e}"]
    return two_leaders(writes(text.splitlines(), user_prefix=user_prefix), lease=lease)


__all__ = ["Write", "check_audit_log", "two_leaders", "writes"]
