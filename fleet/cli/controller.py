"""``k0s-fleet controller``: run the fleet controller (with leader election or sharding).

Composes the process: the controller with its policy (the fleet rollout, wrapped by the
runtime extension's exclusion) given at construction, the status/metrics endpoints and
the runtime extension on every replica, and around the controller either the leader
election (one active replica) or, with ``--shards N``, the shard membership (every
replica active on its share of the clusters; fleet.controllers.shard) plus a Lease
electing the one replica that does the fleet-wide writes.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

from fleet.cli import common, memtrace
from fleet.cli.exit import Exit
from fleet.cli.probes import probes
from fleet.config.errors import ConfigError
from fleet.config.models import FleetConfig
from fleet.controllers.eventloop import new_event_loop
from fleet.controllers.gcpause import GcPauses, freeze_survivors
from fleet.controllers.heap import fixed_mmap_threshold
from fleet.controllers.leader import LeaderElector, LostLeadershipError
from fleet.controllers.runner import FleetController
from fleet.controllers.shard import LostMembershipError, ShardMembership
from fleet.controllers.takeover import Sharding
from fleet.controllers.trigger import Trigger
from fleet.events import EventRecorder
from fleet.extension.exclusion import ExtensionExclusion
from fleet.extension.server import serve_configured_extension
from fleet.kube import WriteLimiter
from fleet.listen import ListenError
from fleet.rollout.policy import RolloutPolicy
from fleet.status.runtime import register_runtime_metrics
from fleet.status.server import StatusBoard, make_app, serve
from fleet.telemetry import get_tracer, setup_tracing

log = logging.getLogger("fleet.controller")

# The controller's writes to the management cluster, per replica (--write-qps /
# --write-burst, chart values writeRateLimit). The limit is for replicas that share one
# API server (--shards): there it is on by default, like client-go's own 5 / 10 and
# controller-runtime's 20 / 30 for reads and writes together, so ten replicas starting
# send at most ~200 writes/s after their bursts (~600 writes each when ten share 1000
# fresh clusters, ~30 s at 20/s). The one active replica of an unsharded fleet writes
# unlimited by default: its fresh-fleet start-up (~6 writes per cluster, 6000 at 1000
# clusters) took 184 s to a complete status at 20/s against 34 s without a limit
# (bench/README.md "Write limit and API priority"), and there is no other writer of ours
# to share the server with.
SHARDED_WRITE_QPS = 20.0
DEFAULT_WRITE_BURST = 50


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_fleet_arguments(p)
    p.add_argument("--identity", default=os.environ.get("POD_NAME") or socket.gethostname(),
                   help="leader election identity (default: $POD_NAME or the host name)")
    p.add_argument("--no-leader-elect", dest="leader_elect", action="store_false",
                   help="run without a Lease (only ever one instance!)")
    p.add_argument("--lease-seconds", type=int, default=15, help="Lease duration")
    p.add_argument("--shards", type=int, default=0,
                   help="split the fleet's clusters into this many shards shared by every "
                        "replica started with the same value (0: one active replica, the "
                        "Lease holder)")
    p.add_argument("--stall-seconds", type=float, default=0,
                   help="stop renewing the Leases (and exit) once the main event loop has "
                        "shown no sign of life for this long (0: four lease durations)")
    p.add_argument("--write-qps", type=float, default=None,
                   help="at most this many writes per second to the management cluster, on "
                        "average, from this replica's controller (its Lease renewals are not "
                        f"limited); 0: no limit (default: {SHARDED_WRITE_QPS:g} with --shards, "
                        "else no limit)")
    p.add_argument("--write-burst", type=int, default=DEFAULT_WRITE_BURST,
                   help="... and at most this many at once (token bucket; default "
                        "%(default)s)")
    p.add_argument("--log-level", default=os.environ.get("K0S_FLEET_LOG_LEVEL", "INFO"),
                   help="the level of every logger, then optionally LOGGER=LEVEL pairs for "
                        "single loggers, comma-separated (e.g. "
                        "INFO,fleet.controllers.runner=DEBUG: one line per planning pass)")


_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


def log_levels(text: str) -> tuple[str, dict[str, str]]:
    """``--log-level``: the root level, then ``LOGGER=LEVEL`` pairs. Raises ValueError
    naming the part that is not understood."""
    root, *pairs = (part.strip() for part in text.split(","))
    if root.upper() not in _LEVELS:
        raise ValueError(f"--log-level: {root!r} is not a level ({', '.join(_LEVELS)})")
    levels: dict[str, str] = {}
    for part in pairs:
        name, sep, level = (x.strip() for x in part.partition("="))
        if not sep or not name or level.upper() not in _LEVELS:
            raise ValueError(f"--log-level: {part!r} is not LOGGER=LEVEL (levels: "
                             f"{', '.join(_LEVELS)})")
        levels[name] = level.upper()
    return root.upper(), levels


def write_qps(args: argparse.Namespace) -> float:
    """--write-qps as given, else the default of the replica's mode (SHARDED_WRITE_QPS)."""
    if args.write_qps is not None:
        return float(args.write_qps)
    return SHARDED_WRITE_QPS if args.shards else 0.0


def write_limiter(qps: float, burst: int) -> WriteLimiter | None:
    """The replica's bound on its writes to the management cluster (None: no bound)."""
    return WriteLimiter(qps, burst, name="management writes") if qps > 0 else None


async def _main(args: argparse.Namespace, config: FleetConfig,
                gc_pauses: GcPauses | None = None) -> int:
    try:
        mgmt = await common.management_client(config)
    except ValueError as e:  # no management kubeconfig and not in a cluster
        return common.fail("controller", e)
    provider = setup_tracing(config.telemetry, resource_attributes={
        "service.instance.id": args.identity})
    try:
        trigger = Trigger()
        # The Leases are renewed on a thread of their own (fleet.controllers.renewal); one
        # whose main loop stalls past --stall-seconds stops renewing and exits.
        stall_seconds: float | None = args.stall_seconds or None
        on_stall = _exit_unless_stopped_within(args.lease_seconds)
        membership = ShardMembership(
            mgmt, namespace=config.management.namespace, identity=args.identity,
            shards=args.shards, lease_seconds=args.lease_seconds,
            on_change=trigger.poke, stall_seconds=stall_seconds,
            on_stall=on_stall) if args.shards else None
        # Every write of the controller, its Event recorder and the rollout policy is
        # fenced by the Lease(s) it is made under (fleet.world.fence): with one leader, the
        # leader Lease; sharded, the member Lease and the cluster's shard claim, and for
        # the fleet-wide writes the writer Lease. A replica resumed after a stop past its
        # renew deadline sends nothing before its renewal task has noticed.
        elector = writer = None
        if membership is not None:
            writer = LeaderElector(mgmt, namespace=config.management.namespace,
                                   identity=args.identity, name=f"{membership.group}-writer",
                                   lease_seconds=args.lease_seconds,
                                   stall_seconds=stall_seconds, on_stall=on_stall)
            fence: Callable[[], bool] | None = membership.write_fence(writer.fence())
        elif args.leader_elect:
            elector = LeaderElector(mgmt, namespace=config.management.namespace,
                                    identity=args.identity, lease_seconds=args.lease_seconds,
                                    stall_seconds=stall_seconds, on_stall=on_stall)
            fence = elector.fence()
        else:
            fence = None  # --no-leader-elect: the only instance
        # The controller's writes wait for a token of the replica's write limiter (its
        # start-up burst spread over time, fleet.kube.ratelimit); the Leases' do not: the
        # membership, the electors and their renewal threads keep `mgmt` as it is.
        limited = mgmt.limited(write_limiter(write_qps(args), args.write_burst))
        writes = limited if fence is None else limited.fenced(fence)
        recorder = EventRecorder(writes, instance=args.identity,
                                 default_namespace=config.management.namespace)
        # Fleet rollout policy (waves, windows, pauses), publishing to /status, /metrics.
        board = StatusBoard()
        # process_*, python_gc_* (with the pauses timed below), k0s_fleet_build_info
        register_runtime_metrics(board.registry, component="controller", gc_pauses=gc_pauses)
        rollout = RolloutPolicy(writes, config, recorder=recorder, board=board,
                                fleet_writer=writer.holds if writer is not None else None)
        # Clusters whose in-place updates CAPI drives through our runtime extension are
        # left to it by the standalone sequencer (extension.mode; docs/runtime-extension.md).
        exclusion = ExtensionExclusion(mgmt, config, rollout, on_change=trigger.poke)
        controller = FleetController(limited, config, identity=args.identity,
                                     recorder=recorder,
                                     trigger=trigger, policy=exclusion,
                                     tracer=get_tracer("fleet.controller", provider),
                                     sharding=Sharding.of(membership) if membership else None,
                                     write_fence=fence, after_start_up=_freeze_startup)
        if membership is not None and controller.takeover is not None:
            controller.takeover.serve(membership)
        health = probes(controller, exclusion, config)
        lease_holder = membership or elector
        if lease_holder is not None:
            health.health.live.add("leases", lambda: lease_holder.problem)

        async def lead() -> None:
            await controller.run()

        async with anyio.create_task_group() as tg:
            async def on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        log.info("stopping")
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(on_signal)
            # HTTP endpoints on every replica. /healthz and /readyz answer what the probes
            # check (fleet.cli.probes): a standby replica is ready once its own
            # parts are, or an HA Deployment never finishes rolling; /status is 503 until
            # this replica leads.
            tg.start_soon(functools.partial(serve, make_app(board, health=health.health),
                                            port=config.status.port))
            # A soak ending or a window opening is announced by no watch event.
            tg.start_soon(rollout.run, trigger.poke, controller.clock)
            tg.start_soon(exclusion.run)
            # CAPI calls the hooks through the Service, i.e. on any replica: serve them on
            # every replica, leader or not (returns at once when the extension is off).
            # UpdateMachine's NodePlan writes go through the replica's fenced client like
            # the controller's: a replica that may not write for the cluster answers CAPI
            # "again later" (docs/runtime-extension.md).
            tg.start_soon(functools.partial(
                serve_configured_extension, config, mgmt=writes,
                tracer=get_tracer("fleet.extension", provider),
                on_serving=health.extension_serving))
            try:
                if membership is not None and writer is not None:
                    if not await _sharded(membership=membership, writer=writer, lead=lead):
                        tg.cancel_scope.cancel()  # the endpoints too: exit, to be restarted
                        return Exit.LOST_LEADERSHIP
                elif elector is not None:
                    await elector.run(lead)
                else:
                    await lead()
            except LostLeadershipError as e:
                log.error("%s", e)
                tg.cancel_scope.cancel()  # the endpoints too: exit, to be restarted
                return Exit.LOST_LEADERSHIP
            tg.cancel_scope.cancel()
        return Exit.OK
    finally:
        with anyio.CancelScope(shield=True):
            await mgmt.close()
            provider.shutdown()


def _exit_unless_stopped_within(lease_seconds: float) -> Callable[[str], None]:
    """What a renewal thread calls once the main loop stalled past its bound: exit the
    process (to be restarted) unless the main loop comes back and stops in order within
    a lease (by then the write fence has long closed: it stops writing 2/3 of a lease
    after its last renewal started)."""
    def on_stall(why: str) -> None:
        log.error("%s: exiting in %ds unless the main loop stops first", why, lease_seconds)

        def exit_now() -> None:
            log.error("main event loop still stalled: exiting")
            for handler in logging.getLogger().handlers:
                handler.flush()
            os._exit(Exit.LOST_LEADERSHIP)

        timer = threading.Timer(lease_seconds, exit_now)
        timer.daemon = True
        timer.start()

    return on_stall


async def _sharded(*, membership: ShardMembership, writer: LeaderElector,
                   lead: Callable[[], Awaitable[None]]) -> bool:
    """Run the controller on this replica's shards until cancelled; False when the member
    Lease was lost (everything stopped before another replica may take the shards).
    ``writer``: the Lease electing the replica that does the fleet-wide writes."""
    lost = False
    try:
        async with anyio.create_task_group() as tg:
            async def fleet_writer() -> None:
                while True:  # hold the writer Lease whenever this replica can
                    try:
                        await writer.run(anyio.sleep_forever)
                    except LostLeadershipError as e:
                        log.warning("%s; no longer the fleet-wide writer", e)
                        await anyio.sleep(writer.retry_every)  # not a busy loop

            async def member(*, task_status: anyio.abc.TaskStatus[None]) -> None:
                nonlocal lost
                try:
                    await membership.run(task_status=task_status)
                except LostMembershipError as e:
                    log.error("%s", e)
                    lost = True
                    tg.cancel_scope.cancel()

            await tg.start(member)
            tg.start_soon(fleet_writer)
            await lead()
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(membership.renew_deadline):
            await membership.release_all()
    return not lost


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    """The exceptions in ``group`` and the groups nested in it."""
    return [leaf for e in group.exceptions
            for leaf in (_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])]


def _freeze_startup(stage: str) -> None:
    """What the start-up built (caches when the first pass is about to run; that pass's
    records once its writes are done) is left out of later garbage collections
    (fleet.controllers.gcpause): their pauses stop the one event loop."""
    log.info("start-up, %s: %d objects left out of garbage collections from now", stage,
             freeze_survivors())


def run(args: argparse.Namespace) -> int:
    memtrace.install_from_environment()
    # large transient buffers (list bodies, /status) mapped and unmapped, not left in the
    # heap: the start-up's peak resident size (fleet.controllers.heap)
    fixed_mmap_threshold()
    gc_pauses = GcPauses()
    gc_pauses.install()  # a long collection stops the event loop: logged (INFO), exported
    try:
        root_level, logger_levels = log_levels(args.log_level)
    except ValueError as e:
        print(f"k0s-fleet controller: {e}", file=sys.stderr)
        return Exit.BAD_CONFIG
    logging.basicConfig(level=root_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name, level in logger_levels.items():
        logging.getLogger(name).setLevel(level)
    try:
        config = common.fleet_config(args)
    except ConfigError as e:
        return common.report_config_error("controller", e)
    if args.shards < 0 or (args.shards and not args.leader_elect):
        print("k0s-fleet controller: --shards must be 0 (one active replica) or a positive "
              f"number of shards, and needs the Leases (not --no-leader-elect); got "
              f"--shards {args.shards}" + ("" if args.leader_elect else
                                           " with --no-leader-elect"), file=sys.stderr)
        return Exit.BAD_CONFIG
    if args.stall_seconds < 0 or (args.stall_seconds and
                                  args.stall_seconds <= args.lease_seconds * 2 / 3):
        print("k0s-fleet controller: --stall-seconds must be 0 (four lease durations) or "
              f"longer than the renew deadline (2/3 of --lease-seconds {args.lease_seconds}); "
              f"got {args.stall_seconds:g}", file=sys.stderr)
        return Exit.BAD_CONFIG
    if write_qps(args) < 0 or args.write_burst < 1:
        print("k0s-fleet controller: --write-qps must be 0 (no limit) or positive and "
              f"--write-burst at least 1; got --write-qps {write_qps(args):g} "
              f"--write-burst {args.write_burst}", file=sys.stderr)
        return Exit.BAD_CONFIG
    try:
        # a burst of watch events (a thousand clusters' Nodes) is read a few sockets a
        # turn, with what they woke in between (fleet.controllers.eventloop)
        return anyio.run(_main, args, config, gc_pauses,
                         backend_options={"loop_factory": new_event_loop})
    except common.BadInputError as e:  # no usable management kubeconfig
        print(f"k0s-fleet controller: {e}", file=sys.stderr)
        return Exit.BAD_CONFIG
    except BaseExceptionGroup as group:
        # An endpoint that cannot listen (its port taken): one line naming it, not the
        # task group's traceback.
        taken, rest = group.split(ListenError)
        if taken is None or rest is not None:
            raise
        for problem in _leaves(taken):
            print(f"k0s-fleet controller: {problem}", file=sys.stderr)
        return Exit.FAILED
