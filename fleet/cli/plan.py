"""``k0s-fleet plan``: a dry run of the rollout from the fleet's current state.

Reads the management cluster (and each workload cluster's Nodes) and prints waves ->
clusters -> objects -> node order, what is upgraded in place and what is left to Cluster
API (and why), the unavailability each step causes and an estimated duration. Writes
nothing.

It judges by the fleet YAML the controller runs with (the chart's ConfigMap in the
controller's namespace) unless ``--config`` names a local one, and says which it used
(:func:`fleet.cli.common.fleet_session`). ``--version VERSION [-l SELECTOR]`` previews a
version before anyone asks for it: the plan as if ``k0s-fleet upgrade VERSION`` had
written its FleetUpgrade (``k0s-fleet upgrade --dry-run`` shows the same), with every
refusal of k0s's version skew policy and each cluster's ladder; it then exits 1 when a
cluster is refused or no cluster is selected, as the upgrade itself would end.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from fleet.cli import common
from fleet.cli.exit import Exit
from fleet.cli.progress import current_steps, wide_columns
from fleet.config.models import ExtensionMode, FleetConfig
from fleet.config.schedule import DurationError, parse_duration
from fleet.contract.selectors import parse_label_selector
from fleet.contract.skew import RULES
from fleet.contract.versions import InvalidVersionError, normalize
from fleet.extension.activation import extension_active, own_endpoint
from fleet.kube import KubeClient, KubeError, KubeObject
from fleet.kube.resources import EXTENSION_CONFIGS
from fleet.rollout.observe import Observation, observe
from fleet.rollout.plan import DryRun, dry_run, plan_document, render_plan
from fleet.world.intent import resolve
from fleet.world.model import ClusterKey, format_time


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_fleet_arguments(p)
    common.add_output_argument(p, wide=True)
    p.add_argument("--node-duration", default="3m",
                   help="assumed time for one node upgrade (estimate), e.g. 3m")
    p.add_argument("--now", help="plan as of this time (RFC 3339), e.g. to see windows")
    add_preview_arguments(p)


def add_preview_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--version", dest="preview_version", metavar="VERSION",
                   help="preview a version: plan as if 'k0s-fleet upgrade VERSION' had been "
                        "asked (writes nothing; exit 1 if k0s's skew policy refuses a "
                        "cluster or no cluster is selected)")
    p.add_argument("-l", "--selector", default="",
                   help="with --version: only clusters with these labels")
    p.add_argument("--name", help="with --version: the FleetUpgrade's name "
                   "(default: upgrade-<version>)")


@dataclasses.dataclass(frozen=True, slots=True)
class Preview:
    """What ``k0s-fleet upgrade VERSION [-l SELECTOR] [--name NAME]`` would write."""

    version: str
    name: str
    selector: dict[str, Any] | None = None
    selector_text: str = ""


def parse_preview(version: str, selector: str = "", name: str | None = None) -> Preview:
    """Raises :class:`~fleet.contract.versions.InvalidVersionError` or
    :class:`~fleet.cli.common.BadInputError` (both bad input, exit 2)."""
    v = normalize(version)
    try:
        sel = parse_label_selector(selector) if selector else None
    except ValueError as e:
        raise common.BadInputError(f"--selector: {e}") from None
    raw = sel.model_dump(mode="json", by_alias=True, exclude_defaults=True) \
        if sel is not None else None
    return Preview(v, name or common.default_name(v), raw or None, selector)


def with_preview(preview: Preview, namespace: str, now: datetime
                 ) -> Callable[[list[KubeObject]], list[KubeObject]]:
    """The FleetUpgrades read, as if the preview's had been written now: created, or (one
    of that name exists) moved to the version, as ``k0s-fleet upgrade`` does it. Given to
    :func:`~fleet.rollout.observe.observe` (``amend_upgrades``), so everything observed
    after (the control planes whose infrastructure Machines are read, the intents) is
    what the controller would see once that FleetUpgrade exists."""

    def amend(upgrades: list[KubeObject]) -> list[KubeObject]:
        body = common.upgrade_object(preview.name, namespace, preview.version,
                                     preview.selector)
        meta = body["metadata"]
        existing = next((u for u in upgrades
                         if (u.get("metadata") or {}).get("name") == preview.name), None)
        old = (existing or {}).get("metadata") or {}
        meta["creationTimestamp"] = old.get("creationTimestamp") or format_time(now)
        meta["generation"] = int(old.get("generation") or 0) + 1
        if existing is not None:
            meta["uid"] = old.get("uid") or ""
            meta["finalizers"] = list(old.get("finalizers") or [])
        return [*(u for u in upgrades if u is not existing), body]

    return amend


def selected(obs: Observation, preview: Preview, namespace: str) -> list[ClusterKey]:
    """The fleet clusters whose version the preview's FleetUpgrade would decide (the newest
    FleetUpgrade selecting a cluster wins)."""
    intents = resolve(obs.snapshot.upgrades.values(), obs.snapshot.clusters)
    return sorted(k for k, t in intents.items()
                  if (t.intent.namespace, t.intent.name) == (namespace, preview.name))


def refusals(run: DryRun, doc: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every refusal of k0s's version skew policy in the plan, with the rule and the
    sentence naming the versions: each cluster refused as a whole (a downgrade, a ladder
    that cannot be built), then, from ``doc``, each object whose version the writer would
    not write (fleet/planner/writer.py: "not written: k0s's version skew policy refuses
    it (<rule>: ...)", or a hand edit beyond one minor it does not adopt)."""
    out = [{"cluster": f"{k[0]}/{k[1]}", "rule": t.refusal[0], "message": t.refusal[1]}
           for k, t in sorted(run.intents.items()) if t.refusal is not None]
    refused = {r["cluster"] for r in out}
    for w in (doc or {}).get("waves") or []:
        for c in w["clusters"]:
            key = f"{c['namespace']}/{c['name']}"
            for o in c["objects"] if key not in refused else ():
                found = _object_refusal(str(o.get("waiting") or ""))
                if found is not None:
                    out.append({"cluster": key, "object": f"{o['kind']} {o['name']}",
                                "rule": found[0], "message": found[1]})
    return out


def _object_refusal(waiting: str) -> tuple[str, str] | None:
    """(rule, message) of a skew refusal quoted in an object's waiting reason."""
    for rule in RULES:
        at = waiting.find(f"({rule}: ")
        if at >= 0:
            return rule, waiting[at + len(rule) + 3:].removesuffix(")")
    return None


async def extension_clusters(mgmt: KubeClient, config: FleetConfig,
                             keys: Iterable[ClusterKey]) -> frozenset[ClusterKey]:
    """Which clusters Cluster API drives through k0s-fleet's extension, as the controller's
    exclusion decides it (an unreadable ExtensionConfig list counts as none)."""
    if not config.extension.enabled or config.extension.mode is ExtensionMode.NEVER:
        return frozenset()
    try:
        configs = (await mgmt.list(EXTENSION_CONFIGS)).items \
            if config.extension.mode is ExtensionMode.AUTO else []
    except KubeError as e:
        print(f"k0s-fleet plan: cannot read ExtensionConfigs: {e}", file=sys.stderr)
        return frozenset()
    return frozenset(k for k in keys if extension_active(
        {"metadata": {"namespace": k[0], "name": k[1]}}, configs, config.extension.mode,
        endpoint=own_endpoint(config.extension)))


async def plan_with(mgmt: KubeClient, config: FleetConfig, *, now: datetime,
                    node_duration: str = "3m", preview: Preview | None = None
                    ) -> tuple[dict[str, Any], Observation]:
    """The plan document (with ``refusals``, and ``preview`` when one is given) and the
    observation it was made from. Reads only."""
    namespace = config.management.namespace
    obs = await observe(mgmt, config, now=now, amend_upgrades=None if preview is None
                        else with_preview(preview, namespace, now))
    obs.extension_clusters = await extension_clusters(mgmt, config, obs.snapshot.clusters)
    run = dry_run(obs, config, now=now, node_duration=parse_duration(node_duration))
    doc = plan_document(run)
    doc["refusals"] = refusals(run, doc)
    if preview is not None:
        doc["preview"] = {
            "fleetUpgrade": f"{namespace}/{preview.name}", "version": preview.version,
            "selector": preview.selector_text or None,
            "clusters": [f"{k[0]}/{k[1]}" for k in selected(obs, preview, namespace)]}
    return doc, obs


async def fleet_plan(config: FleetConfig, *, now: datetime,
                     node_duration: str = "3m") -> dict[str, Any]:
    async with await common.management_client(config) as mgmt:
        doc, _ = await plan_with(mgmt, config, now=now, node_duration=node_duration)
    return doc


def wide_lines(doc: dict[str, Any], obs: Observation, now: datetime) -> dict[str, str]:
    """``-o wide``: per cluster its executors, current step, node and time in step."""
    steps = current_steps(obs.snapshot.nodeplans.values())
    out = {}
    for w in doc["waves"]:
        for c in w["clusters"]:
            cols = wide_columns(steps.get((c["namespace"], c["name"]), []),
                                (o.get("executor") or "" for o in c["objects"]), now)
            out[f"{c['namespace']}/{c['name']}"] = (
                f"executor {cols['executor']}  step {cols['step']}  node {cols['node']}  "
                f"in step {cols['inStep']}")
    return out


def preview_text(doc: dict[str, Any]) -> list[str]:
    p = doc.get("preview")
    if not p:
        return []
    who = f"clusters {p['selector']}" if p["selector"] else "the whole fleet"
    return [f"dry run: FleetUpgrade {p['fleetUpgrade']}: {who} -> {p['version']} "
            f"({len(p['clusters'])} cluster(s) selected); nothing is written"]


def refusals_text(doc: dict[str, Any]) -> list[str]:
    if not doc["refusals"]:
        return []
    return ["refused by k0s's version skew policy (nothing would be written to them):",
            *(f"  {r['cluster']}" + (f" {r['object']}" if r.get("object") else "")
              + f": {r['rule']}: {r['message']}" for r in doc["refusals"])]


def outcome(command: str, doc: dict[str, Any]) -> int:
    """A preview's exit code: 1 when the upgrade it shows would fail at once (a refusal,
    no cluster selected), else 0."""
    p = doc.get("preview")
    if p is None:
        return Exit.OK
    if not p["clusters"]:
        print(f"k0s-fleet {command}: FleetUpgrade {p['fleetUpgrade']} would select no "
              "cluster of the fleet (check the selector and the fleet YAML's clusters)",
              file=sys.stderr)
        return Exit.FAILED
    if doc["refusals"]:
        print(f"k0s-fleet {command}: k0s's version skew policy refuses "
              f"{len(doc['refusals'])} cluster(s)", file=sys.stderr)
        return Exit.FAILED
    return Exit.OK


async def show(command: str, mgmt: KubeClient, resolved: common.ResolvedConfig, *,
               output: str, now: datetime, node_duration: str = "3m",
               preview: Preview | None = None) -> int:
    """Plan, print it in ``output`` (text, wide, json, yaml) and return the exit code."""
    config = resolved.config
    doc, obs = await plan_with(mgmt, config, now=now, node_duration=node_duration,
                               preview=preview)
    if output in ("json", "yaml"):
        doc["config"] = {"source": resolved.source,
                         "namespace": config.management.namespace}
        sys.stdout.write(common.dump(doc, output))
    else:
        wide = wide_lines(doc, obs, now) if output == "wide" else None
        lines = [resolved.banner(), *preview_text(doc), render_plan(doc, wide=wide),
                 *refusals_text(doc)]
        sys.stdout.write("\n".join(lines) + "\n")
    return outcome(command, doc)


def parse_now(value: str | None) -> datetime:
    if not value:
        return datetime.now(UTC)
    try:
        now = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as e:
        raise common.BadInputError(f"--now: {e}") from None
    return now if now.tzinfo is not None else now.replace(tzinfo=UTC)


async def _run(args: argparse.Namespace) -> int:
    now = parse_now(args.now)
    try:
        parse_duration(args.node_duration)
    except DurationError as e:
        raise common.BadInputError(f"--node-duration: {e}") from None
    preview = parse_preview(args.preview_version, args.selector, args.name) \
        if args.preview_version else None
    if preview is None and (args.selector or args.name):
        raise common.BadInputError("-l/--selector and --name go with --version")
    async with common.fleet_session(args) as (mgmt, resolved):
        return await show("plan", mgmt, resolved, output=args.output, now=now,
                          node_duration=args.node_duration, preview=preview)


def run(args: argparse.Namespace) -> int:
    return common.run_command("plan", _run, args, bad_input=(InvalidVersionError,))
