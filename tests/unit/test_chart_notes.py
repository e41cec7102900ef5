"""The controller chart's NOTES.txt (rendered by the real helm, as `helm install` prints it)
shows the next step: how to ask for a version and where to watch it."""

from __future__ import annotations

import re

import yaml

from tests.helpers.charts import CONTROLLER_CHART, helm, scoped


def notes(namespace: str) -> str:
    sets = [a for s in scoped(CONTROLLER_CHART) for a in ("--set", s)]
    out = helm("install", "r1", str(CONTROLLER_CHART), "--namespace", namespace,
               "--dry-run=client", *sets).stdout
    return out.split("\nNOTES:\n", 1)[1]


def test_notes_say_how_to_start_an_upgrade_and_where_to_watch_it() -> None:
    text = notes("fleet-ops")
    # a FleetUpgrade manifest that applies as printed, in the release namespace
    block = re.search(r"\n( {4}apiVersion: fleet\.k0s-fleet\.io/.*?)\nas ", text, re.S)
    assert block, text
    fu = yaml.safe_load(block.group(1))
    crd = yaml.safe_load(
        (CONTROLLER_CHART / "crds" / "fleet.k0s-fleet.io_fleetupgrades.yaml").read_text())
    served = {f'{crd["spec"]["group"]}/{v["name"]}' for v in crd["spec"]["versions"]
              if v.get("served")}
    assert fu["apiVersion"] in served
    assert fu["kind"] == crd["spec"]["names"]["kind"]
    assert fu["metadata"]["namespace"] == "fleet-ops"
    assert fu["spec"]["version"].startswith("v")
    assert "kubectl apply -f fleetupgrade.yaml" in text
    assert "k0s-fleet upgrade v1.32.1+k0s.0 -n fleet-ops" in text
    assert "kubectl -n fleet-ops get fleetupgrades -w" in text
    assert "kubectl get nodeplans -A -w" in text
