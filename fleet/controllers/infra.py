"""Reading a control-plane Machine's infrastructure object (any provider's kind).

k0smotron decides "only the version changed" partly from the infrastructure Machine's
``cloned-from`` annotations (docs/controller.md "Which nodes may be upgraded in place").
The kind is whatever the provider
defines, so its plural comes from API discovery. Only out-of-date control-plane Machines
are looked up at all.

What a read found is kept for ``found_ttl`` (5 min) while the Machine is the same one (its
uid): the ``cloned-from`` annotations are written when the infrastructure Machine is
cloned and not changed after, and a replaced Machine (k0smotron names control planes by
index, so the name may come back) is another uid. A read that failed, or found nothing,
is kept for ``ttl`` (10 s) only. Before, every read was kept 10 s: a rolling cluster's
planning passes (one per watch event, the controller's own status writes included)
re-read its three control planes' infrastructure Machines every 10 s while they were
out of date, each pass waiting for the round trip before it could dispatch (issue #13:
11 908 GETs in a 10 x 300 roll, bench/README.md "Fewer status writes per rolled cluster").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import anyio

from fleet.kube import (
    ForbiddenError,
    KubeClient,
    KubeError,
    NotFoundError,
    UnauthorizedError,
)
from fleet.kube.resources import Resource
from fleet.world.model import InfraMachineInfo, MachineInfo, TemplateRef, infra_machine_from


@dataclass(frozen=True, slots=True)
class _Cached:
    info: InfraMachineInfo
    at: float
    machine_uid: str  # the Machine it was read for ("": not known)


class InfraMachines:
    def __init__(self, client: KubeClient, *, ttl: float = 10.0,
                 found_ttl: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.clock = clock
        self.ttl = ttl
        self.found_ttl = found_ttl
        self.reads = 0  # GETs of infrastructure Machines sent (tests, metrics)
        self._resources: dict[tuple[str, str], Resource | str] = {}
        self._cache: dict[tuple[str, str, str, str], _Cached] = {}
        self._pruned_at_size = 64

    def _fresh(self, cached: _Cached, machine_uid: str, now: float) -> bool:
        if cached.machine_uid != machine_uid:
            return False  # another Machine of the same name: read its own
        found = cached.info.error is None and cached.info.cloned_from_name is not None
        return now - cached.at < (self.found_ttl if found and machine_uid else self.ttl)

    def _prune(self, now: float) -> None:
        """Forget what is past any TTL, once the cache doubled since the last prune."""
        if len(self._cache) < 2 * self._pruned_at_size:
            return
        horizon = max(self.ttl, self.found_ttl)
        self._cache = {k: c for k, c in self._cache.items() if now - c.at < horizon}
        self._pruned_at_size = max(64, len(self._cache))

    async def resource(self, group: str, kind: str) -> Resource | str:
        """The Resource for (group, kind), or a string saying why it cannot be found."""
        key = (group, kind)
        if key in self._resources:
            return self._resources[key]
        try:
            if group:
                found = await self.client.request("GET", f"/apis/{group}")
                gv = str((found.get("preferredVersion") or {}).get("groupVersion") or "")
                listing = await self.client.request("GET", f"/apis/{gv}")
            else:
                gv = "v1"
                listing = await self.client.request("GET", "/api/v1")
        except NotFoundError:
            result: Resource | str = f"API group {group!r} is not served"
            self._resources[key] = result
            return result
        except KubeError as e:
            return f"discovery of {group!r} failed: {e}"  # transient: not cached
        version = gv.split("/", 1)[1] if "/" in gv else gv
        result = f"kind {kind} is not served in {gv}"
        for r in listing.get("resources") or []:
            if r.get("kind") == kind and "/" not in str(r.get("name")):
                result = Resource(group, version, str(r["name"]), kind,
                                  namespaced=bool(r.get("namespaced")))
                break
        self._resources[key] = result
        return result

    async def lookup(self, ref: TemplateRef | None, namespace: str, *,
                     machine_uid: str = "") -> InfraMachineInfo:
        """The infrastructure object ``ref`` of the Machine whose uid is ``machine_uid``."""
        if ref is None:
            return InfraMachineInfo(error="Machine has no infrastructureRef")
        key = (ref.group, ref.kind, namespace, ref.name)
        cached = self._cache.get(key)
        if cached is not None and self._fresh(cached, machine_uid, self.clock()):
            return cached.info
        res = await self.resource(ref.group, ref.kind)
        if isinstance(res, str):
            info = InfraMachineInfo(error=res)
        else:
            try:
                self.reads += 1
                obj = await self.client.get(res, ref.name, namespace if res.namespaced else None)
                info = infra_machine_from(obj)
            except NotFoundError:
                info = InfraMachineInfo(error=f"{ref} not found")
            except (ForbiddenError, UnauthorizedError) as e:
                info = InfraMachineInfo(error=f"reading {ref}: {e}", denied=True)
            except KubeError as e:
                info = InfraMachineInfo(error=f"reading {ref}: {e}")
        now = self.clock()
        self._cache[key] = _Cached(info, now, machine_uid)
        self._prune(now)
        return info

    async def for_machines(self, machines: Iterable[MachineInfo]
                           ) -> dict[tuple[str, str], InfraMachineInfo]:
        """The infrastructure objects of ``machines`` (looked up concurrently), by the
        Machine's (namespace, name)."""
        out: dict[tuple[str, str], InfraMachineInfo] = {}

        async def one(m: MachineInfo) -> None:
            out[(m.ref.namespace, m.ref.name)] = await self.lookup(
                m.infrastructure, m.ref.namespace, machine_uid=m.ref.uid)

        async with anyio.create_task_group() as tg:
            for m in machines:
                tg.start_soon(one, m)
        return out
