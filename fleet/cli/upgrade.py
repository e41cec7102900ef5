"""``k0s-fleet upgrade VERSION``: ask the fleet for a k0s version, and follow it.

Creates (or updates) one ``FleetUpgrade`` in the controller's namespace
(``management.namespace``): "this fleet, or the clusters matching ``--selector``, go to
VERSION". The controller does the rest as the fleet YAML's rollout policy allows (waves,
windows, budgets) and writes the FleetUpgrade's status, which this command prints until
it is ``Complete`` (exit 0) or ``Failed`` (exit 1: failed nodes, or k0s's version skew
policy refuses a cluster), selects no cluster of the fleet (exit 1, at once), or
``--timeout`` passes (exit 3).
``--no-wait`` returns once the object is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import anyio

from fleet.cli import common
from fleet.kube import AlreadyExistsError, KubeClient
from fleet.kube.resources import FLEET_UPGRADES
from fleet.nodeplan import version_slug
from fleet.schedule import parse_duration
from fleet.selectors import LabelSelector, parse_label_selector
from fleet.versions import InvalidVersionError, normalize


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_fleet_arguments(p)
    common.add_output_argument(p)
    p.add_argument("version", help="k0s version, e.g. v1.31.3+k0s.0")
    p.add_argument("--name", help="FleetUpgrade name (default: upgrade-<version>)")
    p.add_argument("-l", "--selector", default="",
                   help="only clusters with these labels, e.g. 'k0s-fleet.io/ring=canary' "
                        "(default: the whole fleet)")
    p.add_argument("--no-wait", dest="wait", action="store_false",
                   help="write the FleetUpgrade and return")
    p.add_argument("--timeout", default="6h", help="how long to follow, e.g. 90m")


def upgrade_object(name: str, namespace: str, version: str,
                   selector: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"version": version}
    if selector:
        spec["clusterSelector"] = selector
    return {"apiVersion": "fleet.k0s-fleet.io/v1alpha1", "kind": "FleetUpgrade",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "k0s-fleet"}},
            "spec": spec}


def default_name(version: str) -> str:
    return f"upgrade-{version_slug(version)}"


def progress_line(obj: dict[str, Any]) -> str:
    st = obj.get("status") or {}
    waves = ", ".join(f"{w['name']} {w.get('phase', '?')} {w.get('complete', 0)}/"
                      f"{w.get('clusters', 0)}" for w in st.get("waves") or [])
    return (f"{st.get('phase') or 'Pending'}: {st.get('summary') or '-'} clusters, "
            f"{st.get('nodesUpToDate', 0)}/{st.get('nodesTotal', 0)} nodes"
            + (f" [{waves}]" if waves else "") + (f" - {st['message']}" if st.get("message")
                                                    else ""))


def reason_of(obj: dict[str, Any], ctype: str) -> str | None:
    return next((c.get("reason") for c in (obj.get("status") or {}).get("conditions") or []
                 if c.get("type") == ctype), None)


def condition(obj: dict[str, Any], ctype: str) -> bool:
    return any(c.get("type") == ctype and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


async def apply_upgrade(mgmt: KubeClient, *, namespace: str, name: str, version: str,
                        selector: dict[str, Any] | None) -> dict[str, Any]:
    """Create the FleetUpgrade, or move an existing one of that name to ``version``."""
    body = upgrade_object(name, namespace, version, selector)
    try:
        return await mgmt.create(FLEET_UPGRADES, body, namespace)
    except AlreadyExistsError:
        return await mgmt.patch(
            FLEET_UPGRADES, name, {"spec": {"version": version,
                                            "clusterSelector": selector or None}}, namespace)


async def follow(mgmt: KubeClient, *, namespace: str, name: str, generation: int,
                 out: Any = sys.stdout, as_json: bool = False, poll: float = 1.0) -> int:
    """Print the FleetUpgrade's progress until Complete (0) or Failed (1)."""
    last = ""
    while True:
        obj = await mgmt.get(FLEET_UPGRADES, name, namespace)
        st = obj.get("status") or {}
        current = int(st.get("observedGeneration") or 0) >= generation
        line = json.dumps(st, sort_keys=True) if as_json else progress_line(obj)
        if current and line != last:
            out.write(line + "\n")
            out.flush()
            last = line
        if current and condition(obj, "Complete"):
            return common.Exit.OK
        if current and condition(obj, "Failed"):
            return common.Exit.FAILED
        if current and reason_of(obj, "Complete") == "NoClusters":
            # Nothing would ever move: say so now instead of waiting out --timeout.
            print(f"k0s-fleet upgrade: FleetUpgrade {namespace}/{name} selects no cluster "
                  "of the fleet (check its clusterSelector and the fleet YAML's clusters)",
                  file=sys.stderr)
            return common.Exit.FAILED
        await anyio.sleep(poll)


async def _run(args: argparse.Namespace) -> int:
    config = common.fleet_config(args)
    version = normalize(args.version)
    selector: LabelSelector | None = parse_label_selector(args.selector) \
        if args.selector else None
    raw_selector = selector.model_dump(mode="json", by_alias=True, exclude_defaults=True) \
        if selector is not None else None
    timeout = parse_duration(args.timeout).total_seconds()
    namespace = config.management.namespace
    name = args.name or default_name(version)
    async with await common.management_client(config) as mgmt:
        obj = await apply_upgrade(mgmt, namespace=namespace, name=name, version=version,
                                  selector=raw_selector)
        print(f"fleetupgrade.fleet.k0s-fleet.io/{name} in {namespace}: "
              f"{'clusters ' + args.selector if args.selector else 'the whole fleet'} -> "
              f"{version}", file=sys.stderr)
        if not args.wait:
            return common.Exit.OK
        with anyio.move_on_after(timeout):
            return await follow(mgmt, namespace=namespace, name=name,
                                generation=int(obj["metadata"].get("generation") or 1),
                                as_json=args.output == "json")
        print(f"k0s-fleet upgrade: not complete after {args.timeout}", file=sys.stderr)
        return common.Exit.NOT_DONE


def run(args: argparse.Namespace) -> int:
    return common.run_command("upgrade", _run, args, bad_input=(InvalidVersionError,))
