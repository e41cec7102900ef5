"""Start-up settling: which of this replica's clusters a pass plans, and from when.

A restarted controller plans nothing before every workload cluster of its own has given a
first answer (its Nodes listed, an unusable kubeconfig, or unreachable for the registry's
bound), at most ``bound`` seconds; a cluster that becomes this replica's later (a shard
taken over) is planned once it has answered, on its own, while the others are planned.
Until then a cluster is judged like another replica's (from the management objects),
never from an empty cache. The start-up's two moments are told to ``after_start_up``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from fleet.controllers.parts import FleetParts
from fleet.world.clusters import ClusterRegistry
from fleet.world.model import ClusterKey

log = logging.getLogger(__name__)


class Settling:
    """The start-up's wait for first answers (see the module docstring)."""

    def __init__(self, registry: ClusterRegistry, parts: FleetParts, *, bound: float,
                 after_start_up: Callable[[str], None] | None = None) -> None:
        """``bound``: how long a workload cluster's first answer is waited for before it
        is planned on; ``after_start_up``: called with ``"first pass"`` when the first
        pass is about to run, and with ``"first quiet"`` once the work that pass started
        is done (:meth:`after_pass`)."""
        self.registry = registry
        self.parts = parts
        self.bound = bound
        self.settled = False  # the first pass ran
        self.after_start_up = after_start_up
        self._quiet_seen = after_start_up is None
        self.mine: set[ClusterKey] = set()  # the fleet's clusters this replica acts on
        self.planned: set[ClusterKey] = set()  # ... and has heard from (planned)
        self._wanted_since: dict[ClusterKey, float] = {}  # monotonic, when it became ours
        self._said_unanswered: set[ClusterKey] = set()  # logged as waiting for an answer
        self._past_bound: set[ClusterKey] = set()  # of mine, waited for past the bound

    def asked_for(self, mine: set[ClusterKey]) -> None:
        """The clusters this replica acts on were asked of the registry (a new one is
        waited for from now)."""
        t = time.monotonic()
        self._wanted_since = {k: self._wanted_since.get(k, t) for k in mine}
        self._past_bound &= mine  # (one that left and comes back is waited for afresh)
        self.mine = mine

    def answered(self, mine: set[ClusterKey]) -> set[ClusterKey]:
        """Of the clusters this replica acts on, those a pass plans (past the first pass):
        those that answered, or were waited for past the bound; logs what changed."""
        t = time.monotonic()
        # Past the first pass the bound holds for every cluster but one just taken over,
        # and stays held: those are remembered, and only the others looked at (asking
        # the registry about each of 1000 clusters on every pass was an eighth of the
        # passes' CPU during a start-up, and the walk over them alone 4 % of a pass's
        # while one cluster rolled: bench/README.md).
        past = self._past_bound
        rest = mine - past
        if rest:
            wanted, bound = self._wanted_since, self.bound
            past |= {k for k in rest if t - wanted[k] >= bound}
            acting = (mine & past) | {k for k in rest - past if self.registry.settled(k)}
        else:
            acting = set(mine)
        if acting != mine:
            self._say_unanswered(mine - acting, t)
        if acting - self.planned:
            self._say_answered(acting - self.planned, t)
        return acting

    def after_pass(self, idle: Callable[[], bool]) -> None:
        """After each pass: once the first pass's work is done (``idle``: nothing in
        flight, no change waiting), ``after_start_up("first quiet")``, once."""
        if not self._quiet_seen and self.settled and idle():
            self._quiet_seen = True
            assert self.after_start_up is not None
            self.after_start_up("first quiet")

    def _say_answered(self, new: set[ClusterKey], t: float) -> None:
        """Log the clusters taken over (past the first pass) that are planned from now."""
        waited = sorted(t - self._wanted_since[k] for k in new
                        if self._wanted_since[k] > -math.inf)
        if waited:
            log.info("acting on %d more clusters (%s), %.1f-%.1fs after they became this "
                     "replica's", len(waited), ", ".join(f"{ns}/{n}" for ns, n in
                                                         sorted(new)[:5]),
                     waited[0], waited[-1])
        for k in new:
            self._said_unanswered.discard(k)

    def _say_unanswered(self, waiting: set[ClusterKey], t: float) -> None:
        """Log once per cluster what a taken-over cluster still waits for, 10 s on."""
        for k in sorted(waiting):
            if k in self._said_unanswered or t - self._wanted_since[k] < 10:
                continue
            self._said_unanswered.add(k)
            log.info("workload cluster %s/%s: no answer %.0fs after it became this "
                     "replica's (%s); planned anyway %.0fs after", k[0], k[1],
                     t - self._wanted_since[k], self.registry.waiting_for(k),
                     self.bound)

    def first_pass(self) -> bool:
        """Whether the first pass may run (False: asked again a second later).
        Before the first pass: wait until every workload cluster of this replica has
        given an answer (listed, unusable kubeconfig, or unreachable for the registry's
        bound), so that a restarted controller writes no status from caches that are not
        there yet (it would write them back a moment later). Bounded: past
        ``bound`` seconds it plans anyway, and says which clusters it could not hear
        from."""
        waiting = sorted(k for k in self.mine if not self.registry.settled(k))
        # Bounded from when those clusters were asked for (the first pass, once the
        # management caches synced), not from the start: a slow management list under
        # load used up the whole bound before one workload cluster was asked.
        started = min((self._wanted_since[k] for k in waiting), default=time.monotonic())
        if waiting and time.monotonic() - started < self.bound:
            return False  # (the caller looks again in a second)
        if waiting:
            log.warning("planning although %d workload clusters have not answered within "
                        "%.0fs: %s", len(waiting), self.bound,
                        ", ".join(f"{ns}/{name}" for ns, name in waiting[:10]))
        else:
            log.info("every workload cluster answered; planning")
        self.settled = True
        if self.after_start_up is not None:
            self.after_start_up("first pass")
        # Past the first pass: what was waited for (or given up on) is planned from now on.
        self._wanted_since = dict.fromkeys(self.mine, -math.inf)
        self.parts.touch_all()
        return True
