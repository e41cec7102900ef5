"""The object store of one simulated cluster: what etcd and the API server's registry do.

Per virtual cluster: one resourceVersion counter (every write bumps it, like an etcd
revision), objects kept as their JSON bytes (10 000 realistic Nodes cost ~140 MB this
way, several times that as Python dicts), a bounded history of changes from which
watches resume, and live watchers. A watch asked to resume from a resourceVersion older
than the retained history is told 410 Gone, as a compacted etcd would; ``compact()``
forgets the history on purpose.

Pure Python on one event loop: every method runs to completion without awaiting, so a
write and its delivery to watchers are atomic with respect to each other.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fleet.testing.kubesim.patches import PatchError, apply_patch

DEFAULT_HISTORY = 2000
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class Kind:
    """One served resource type."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    has_status: bool = False  # a status subresource (main writes keep status, and back)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


SERVED: tuple[Kind, ...] = (
    Kind("", "v1", "nodes", "Node", namespaced=False, has_status=True),
    Kind("", "v1", "namespaces", "Namespace", namespaced=False, has_status=True),
    Kind("", "v1", "configmaps", "ConfigMap", namespaced=True),
    Kind("", "v1", "secrets", "Secret", namespaced=True),
    Kind("", "v1", "pods", "Pod", namespaced=True, has_status=True),
    Kind("", "v1", "events", "Event", namespaced=True),
    Kind("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True),
    Kind("events.k8s.io", "v1", "events", "Event", namespaced=True),
    Kind("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True),
    Kind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", namespaced=True,
         has_status=True),
    # Served by every API server (none installed here): k0s-fleet watches the autopilot
    # CRDs' absence on it. Not served, every cluster polled for them instead (two 404s
    # per CRD a minute, at 1000 clusters most of an idle controller's CPU).
    Kind("apiextensions.k8s.io", "v1", "customresourcedefinitions",
         "CustomResourceDefinition", namespaced=False, has_status=True),
)
KINDS: dict[tuple[str, str, str], Kind] = {(k.group, k.version, k.plural): k for k in SERVED}


class ApiError(Exception):
    """An answer other than success: HTTP status, Status reason, message."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message

    def status(self) -> dict[str, Any]:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}


def not_found(kind: Kind, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{kind.plural} "{name}" not found')


def conflict(kind: Kind, name: str) -> ApiError:
    return ApiError(409, "Conflict",
                    f'Operation cannot be fulfilled on {kind.plural} "{name}": the object has '
                    "been modified; please apply your changes to the latest version and try "
                    "again")


@dataclass(slots=True)
class Stored:
    """One object as kept: its bytes plus what selectors and ordering need."""

    kind: Kind
    namespace: str
    name: str
    rv: int
    labels: dict[str, str]
    fields: dict[str, str]
    raw: bytes

    def decode(self) -> dict[str, Any]:
        return json.loads(self.raw)  # type: ignore[no-any-return]


def _fields(kind: Kind, obj: dict[str, Any]) -> dict[str, str]:
    meta = obj.get("metadata") or {}
    out = {"metadata.name": str(meta.get("name") or "")}
    if kind.namespaced:
        out["metadata.namespace"] = str(meta.get("namespace") or "")
    if kind.plural == "pods":
        out["spec.nodeName"] = str((obj.get("spec") or {}).get("nodeName") or "")
        out["status.phase"] = str((obj.get("status") or {}).get("phase") or "")
    if kind.plural == "nodes":
        out["spec.unschedulable"] = "true" if (obj.get("spec") or {}).get("unschedulable") \
            else "false"
    if kind.plural == "events":
        for f in ("involvedObject", "regarding"):
            ref = obj.get(f) or {}
            for k in ("name", "namespace", "kind", "uid"):
                if ref.get(k):
                    out[f"{f}.{k}"] = str(ref[k])
    return out


# -- selectors ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        v = labels.get(self.key)
        if self.op == "=":
            return v == self.values[0]
        if self.op == "!=":
            return v != self.values[0]
        if self.op == "in":
            return v in self.values
        if self.op == "notin":
            return v not in self.values
        if self.op == "exists":
            return v is not None
        return v is None


_SET_RE = re.compile(r"^([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)$")


def _split_top(expr: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for c in expr:
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def parse_label_selector(expr: str | None) -> tuple[Requirement, ...]:
    if not expr:
        return ()
    reqs = []
    for part in _split_top(expr):
        if m := _SET_RE.match(part):
            reqs.append(Requirement(m[1], m[2], tuple(v.strip() for v in m[3].split(",")
                                                      if v.strip())))
        elif "!=" in part:
            k, v = part.split("!=", 1)
            reqs.append(Requirement(k.strip(), "!=", (v.strip(),)))
        elif "=" in part:
            k, v = part.split("==", 1) if "==" in part else part.split("=", 1)
            reqs.append(Requirement(k.strip(), "=", (v.strip(),)))
        elif part.startswith("!"):
            reqs.append(Requirement(part[1:].strip(), "!"))
        elif re.fullmatch(r"[A-Za-z0-9./_-]+", part):
            reqs.append(Requirement(part, "exists"))
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {part!r}")
    return tuple(reqs)


def parse_field_selector(expr: str | None, kind: Kind) -> tuple[Requirement, ...]:
    if not expr:
        return ()
    reqs = []
    known = set(_fields(kind, {"metadata": {}}))
    if kind.plural == "pods":
        known |= {"spec.nodeName", "status.phase"}
    for part in _split_top(expr):
        op = "!=" if "!=" in part else "="
        k, v = part.split("==" if "==" in part else op, 1)
        k = k.strip()
        if k not in known and not (kind.plural == "events" and "." in k):
            raise ApiError(400, "BadRequest", f'field label not supported: "{k}" '
                           f"(for {kind.plural})")
        reqs.append(Requirement(k, op, (v.strip(),)))
    return tuple(reqs)


def matches(obj: Stored, labels: tuple[Requirement, ...],
            fields: tuple[Requirement, ...]) -> bool:
    return all(r.matches(obj.labels) for r in labels) and \
        all(r.matches(obj.fields) for r in fields)


# -- watches ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Selection:
    """Which objects a list or watch is about."""

    kind: Kind
    namespace: str | None = None
    labels: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()

    def wants(self, obj: Stored) -> bool:
        return obj.kind == self.kind and (self.namespace is None
                                          or obj.namespace == self.namespace) \
            and matches(obj, self.labels, self.fields)


@dataclass(eq=False)
class Watcher:
    """One open watch: the changes it is still to send, in order, each with the time it
    was queued (``time.monotonic()``); None queued means the watch is to end.

    The sender (``KubeSim._pump``) sends whatever is pending before it decides anything
    else and waits on ``wakeup`` (which only says "look again") when nothing is: whether
    a change goes out never depends on how a timed wait ended (see ``_pump``)."""

    selection: Selection
    pending: deque[tuple[float, str, Stored] | None] = field(default_factory=deque)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    last_sent: float | None = None  # monotonic time of the last event or bookmark sent

    def wants(self, obj: Stored) -> bool:
        return self.selection.wants(obj)

    def push(self, etype: str, obj: Stored) -> None:
        self.pending.append((time.monotonic(), etype, obj))
        self.wakeup.set()

    def end(self) -> None:
        self.pending.append(None)
        self.wakeup.set()

    def held(self, now: float) -> float:
        """Seconds the oldest change not yet sent has waited (0: none waiting)."""
        first = self.pending[0] if self.pending else None
        return 0.0 if first is None else now - first[0]


@dataclass(frozen=True, slots=True)
class Change:
    type: str  # ADDED, MODIFIED, DELETED
    obj: Stored


Listener = Callable[[str, "ClusterStore", Change], None]


class ClusterStore:
    """Objects, resourceVersions, history and watchers of one virtual cluster."""

    def __init__(self, name: str, *, history: int = DEFAULT_HISTORY,
                 on_change: Listener | None = None) -> None:
        self.name = name
        self.rv = 1
        self.objects: dict[Kind, dict[tuple[str, str], Stored]] = {k: {} for k in SERVED}
        self.history: deque[tuple[int, Change]] = deque(maxlen=history)
        self.oldest = 1  # a watch may resume from any resourceVersion >= this
        self.watchers: set[Watcher] = set()
        self.on_change = on_change

    # -- reads -------------------------------------------------------------------------
    def get(self, kind: Kind, namespace: str, name: str) -> Stored:
        obj = self.objects[kind].get((namespace, name))
        if obj is None:
            raise not_found(kind, name)
        return obj

    def select(self, sel: Selection) -> list[Stored]:
        objs = self.objects[sel.kind]
        return [objs[k] for k in sorted(objs) if sel.wants(objs[k])]

    def page(self, sel: Selection, limit: int, cont: str | None
             ) -> tuple[list[Stored], int, str | None, int]:
        """(items, list resourceVersion, continue token, remaining) of one list page."""
        list_rv = self.rv
        after: tuple[str, str] | None = None
        if cont:
            try:
                token = json.loads(base64.urlsafe_b64decode(cont.encode()))
                list_rv, after = int(token["rv"]), (str(token["ns"]), str(token["name"]))
            except (ValueError, KeyError, TypeError):
                raise ApiError(400, "BadRequest", "continue key is not valid") from None
            # (as a watch: the revision compacted to is still there, older ones are not)
            if list_rv < self.oldest - 1:
                raise ApiError(410, "Expired", "The provided continue parameter is too old "
                               "to display a consistent list result. You can start a new "
                               "list without the continue parameter.")
        items = [o for o in self.select(sel)
                 if after is None or (o.namespace, o.name) > after]
        if limit <= 0 or len(items) <= limit:
            return items, list_rv, None, 0
        page = items[:limit]
        last = page[-1]
        token = base64.urlsafe_b64encode(json.dumps(
            {"rv": list_rv, "ns": last.namespace, "name": last.name}).encode()).decode()
        return page, list_rv, token, len(items) - limit

    # -- watches -----------------------------------------------------------------------
    def watch(self, sel: Selection, resource_version: str) -> tuple[Watcher, list[Change]]:
        """A registered watcher plus the changes it must be sent first."""
        w = Watcher(sel)
        if resource_version in ("", "0"):
            backlog = [Change("ADDED", o) for o in self.select(sel)]
        else:
            try:
                since = int(resource_version)
            except ValueError:
                raise ApiError(400, "BadRequest",
                               f"invalid resource version {resource_version!r}") from None
            if since < self.oldest - 1:
                raise ApiError(410, "Expired",
                               f"too old resource version: {since} ({self.oldest - 1})")
            backlog = [c for rv, c in self.history if rv > since and w.wants(c.obj)]
        self.watchers.add(w)
        return w, backlog

    def unwatch(self, w: Watcher) -> None:
        self.watchers.discard(w)

    def compact(self) -> int:
        """Forget all history (as an etcd compaction to the current revision)."""
        self.history.clear()
        self.oldest = self.rv + 1
        return self.rv

    def close_watches(self) -> None:
        for w in list(self.watchers):
            w.end()
        self.watchers.clear()

    # -- writes ------------------------------------------------------------------------
    def _commit(self, etype: str, kind: Kind, obj: dict[str, Any] | None,
                old: Stored | None) -> Stored:
        self.rv += 1
        if obj is None:  # deletion: the last state, at the deletion's resourceVersion
            assert old is not None
            body = old.decode()
            body["metadata"]["resourceVersion"] = str(self.rv)
        else:
            body = obj
            body["metadata"]["resourceVersion"] = str(self.rv)
        meta = body["metadata"]
        stored = Stored(kind, str(meta.get("namespace") or ""), str(meta["name"]), self.rv,
                        dict(meta.get("labels") or {}), _fields(kind, body),
                        json.dumps(body, separators=(",", ":")).encode())
        key = (stored.namespace, stored.name)
        if etype == "DELETED":
            self.objects[kind].pop(key, None)
        else:
            self.objects[kind][key] = stored
        change = Change(etype, stored)
        if len(self.history) == self.history.maxlen:
            self.oldest = self.history[0][0] + 1
        self.history.append((self.rv, change))
        for w in self.watchers:
            if w.wants(stored):
                w.push(etype, stored)
        if self.on_change is not None:
            self.on_change(self.name, self, change)
        return stored

    def create(self, kind: Kind, namespace: str, body: Any) -> Stored:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the request body is not a JSON object")
        obj = json.loads(json.dumps(body))
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata is not an object")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        name = meta.get("name")
        if not name:
            raise ApiError(422, "Invalid", f"{kind.kind} is invalid: metadata.name: Required "
                           "value: name or generateName is required")
        if not isinstance(name, str) or len(name) > 253 or not NAME_RE.match(name):
            raise ApiError(422, "Invalid", f"{kind.kind} {name!r} is invalid: metadata.name: "
                           "a lowercase RFC 1123 subdomain must consist of lower case "
                           "alphanumeric characters, '-' or '.'")
        if kind.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise ApiError(400, "BadRequest", "the namespace of the provided object does "
                               "not match the namespace sent on the request")
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if (meta.get("namespace") or "", name) in self.objects[kind]:
            raise ApiError(409, "AlreadyExists", f'{kind.plural} "{name}" already exists')
        if meta.get("resourceVersion"):
            raise ApiError(400, "BadRequest",
                           "resourceVersion should not be set on objects to be created")
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        obj["kind"], obj["apiVersion"] = kind.kind, kind.api_version
        return self._commit("ADDED", kind, obj, None)

    def _update(self, kind: Kind, current: Stored, new: Any, subresource: str | None,
                precondition: str | None) -> Stored:
        if not isinstance(new, dict) or not isinstance(new.get("metadata", {}), dict):
            raise ApiError(400, "BadRequest", "the object is not a JSON object with metadata")
        if precondition and precondition != str(current.rv):
            raise conflict(kind, current.name)
        old = current.decode()
        meta = new.setdefault("metadata", {})
        if meta.get("name", current.name) != current.name:
            raise ApiError(400, "BadRequest", "the name of the object "
                           f"({meta.get('name')}) does not match the name on the URL "
                           f"({current.name})")
        for immutable in ("uid", "creationTimestamp", "namespace"):
            if immutable in old["metadata"]:
                meta[immutable] = old["metadata"][immutable]
        meta["name"] = current.name
        if subresource == "status":
            new = {**old, "status": new.get("status")}
            if new["status"] is None:
                del new["status"]
        elif subresource is not None:
            raise ApiError(404, "NotFound", f"{kind.plural}/{subresource} is not served")
        elif kind.has_status:
            new = {k: v for k, v in new.items() if k != "status"}
            if "status" in old:
                new["status"] = old["status"]
        new["kind"], new["apiVersion"] = kind.kind, kind.api_version
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if new == old:
            return current  # a no-op write changes nothing, not even the resourceVersion
        return self._commit("MODIFIED", kind, new, current)

    def replace(self, kind: Kind, namespace: str, name: str, body: Any,
                subresource: str | None = None) -> Stored:
        current = self.get(kind, namespace, name)
        rv = ((body or {}).get("metadata") or {}).get("resourceVersion") \
            if isinstance(body, dict) else None
        return self._update(kind, current, json.loads(json.dumps(body)), subresource,
                            str(rv) if rv else None)

    def patch(self, kind: Kind, namespace: str, name: str, *, content_type: str, patch: Any,
              subresource: str | None = None) -> Stored:
        current = self.get(kind, namespace, name)
        old = current.decode()
        try:
            new = apply_patch(content_type, old, patch)
        except PatchError as e:
            code = 415 if "content type" in str(e) else 422
            raise ApiError(code, "UnsupportedMediaType" if code == 415 else "Invalid",
                           str(e)) from None
        rv = (new.get("metadata") or {}).get("resourceVersion") \
            if isinstance(new, dict) else None
        # The precondition is the resourceVersion the patch sets (merge patches carry it).
        precondition = str(rv) if rv and str(rv) != str(current.rv) else None
        if precondition:
            raise conflict(kind, name)
        return self._update(kind, current, new, subresource, None)

    def delete(self, kind: Kind, namespace: str, name: str,
               preconditions: dict[str, Any] | None = None) -> Stored:
        current = self.get(kind, namespace, name)
        pre = preconditions or {}
        if pre.get("resourceVersion") and str(pre["resourceVersion"]) != str(current.rv):
            raise conflict(kind, name)
        if pre.get("uid") and pre["uid"] != current.decode()["metadata"].get("uid"):
            raise ApiError(409, "Conflict", f'Precondition failed: UID in precondition: '
                           f'{pre["uid"]}, UID in object meta: '
                           f'{current.decode()["metadata"].get("uid")}')
        return self._commit("DELETED", kind, None, current)

    def seed(self, kind: Kind, objects: Iterable[dict[str, Any]]) -> None:
        for obj in objects:
            self.create(kind, str((obj.get("metadata") or {}).get("namespace") or ""), obj)


