"""Count API requests where they land: the kube-apiserver's own audit log.

``audit_args(dir)`` writes an audit policy (every request at level Metadata, except the
API server's own loopback traffic) and returns the kube-apiserver flags that log it as
JSON lines to ``dir/audit.log`` (blocking mode: a request's event is on disk before its
response is). :class:`AuditLog` reads that file between two marks and names, for each
request, who made it (the authenticated user), the verb and the resource.

Counting at the server sees every client alike (the controller's caches, the agents'
own client, retries after 409s, watch re-connects), which in-process counters cannot.
Each request is counted once: a watch when its response starts, anything else when it
completes (a watch refused before it starts has only that completion).
Nothing here runs in production.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    users: ["system:apiserver"]
  - level: Metadata
"""


def audit_args(directory: Path) -> list[str]:
    """kube-apiserver flags auditing every client request into ``directory/audit.log``."""
    directory.mkdir(parents=True, exist_ok=True)
    policy = directory / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    return [f"--audit-policy-file={policy}", f"--audit-log-path={directory / 'audit.log'}",
            "--audit-log-format=json", "--audit-log-mode=blocking",
            "--audit-log-maxbackup=0", "--audit-log-maxsize=0"]


@dataclass(frozen=True, slots=True)
class AuditedRequest:
    """One request as the API server saw it."""

    user: str
    verb: str  # get, list, watch, create, update, patch, delete, ...
    resource: str  # "nodes", "nodeplans/status", or the path of a non-resource request
    namespace: str
    name: str
    code: int

    @property
    def write(self) -> bool:
        return self.verb in ("create", "update", "patch", "delete", "deletecollection")


def _request(event: dict[str, Any]) -> AuditedRequest:
    ref = event.get("objectRef") or {}
    resource = str(ref.get("resource") or event.get("requestURI") or "")
    if ref.get("subresource"):
        resource += f"/{ref['subresource']}"
    return AuditedRequest(
        user=str((event.get("user") or {}).get("username") or ""),
        verb=str(event.get("verb") or ""), resource=resource,
        namespace=str(ref.get("namespace") or ""), name=str(ref.get("name") or ""),
        code=int((event.get("responseStatus") or {}).get("code") or 0))


class AuditLog:
    """The audit log of one API server, read between marks (byte offsets)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        """A point in the log: the end of its last complete line."""
        if not self.path.exists():
            return 0
        data = self.path.read_bytes()
        return data.rfind(b"\n") + 1

    def requests(self, since: int = 0, until: int | None = None) -> list[AuditedRequest]:
        """Every request counted between two marks (``until`` None: up to now)."""
        data = self.path.read_bytes() if self.path.exists() else b""
        end = data.rfind(b"\n") + 1 if until is None else until
        events = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
        started = {e.get("auditID") for e in events if e.get("stage") == "ResponseStarted"}
        out: list[AuditedRequest] = []
        offset = 0
        for line in data[:end].splitlines(keepends=True):
            at, offset = offset, offset + len(line)
            if at < since or not line.strip():
                continue
            event = json.loads(line)
            stage = event.get("stage")
            if stage == "ResponseStarted" or (
                    stage == "ResponseComplete" and event.get("auditID") not in started):
                out.append(_request(event))
        return out


def tally(requests: Iterable[AuditedRequest], *, by: str = "verb") -> Counter[str]:
    """Requests counted by ``verb``, ``resource`` or ``verb resource``."""
    counts: Counter[str] = Counter()
    for r in requests:
        key = {"verb": r.verb, "resource": r.resource}.get(by, f"{r.verb} {r.resource}")
        counts[key] += 1
    return counts
