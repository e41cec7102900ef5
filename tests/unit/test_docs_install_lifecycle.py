"""docs/operations.md installs, upgrades and uninstalls every CRD the chart ships.

Helm installs charts/k0s-fleet/crds/ on the first install only and never upgrades or
deletes them, so the guide must: name each CRD in "What gets installed where", apply them
before `helm upgrade` ("Upgrading k0s-fleet"), and delete FleetUpgrades, then NodePlans
(while the controller runs to release their finalizer), then the release, then the CRDs
("Uninstall")."""

from __future__ import annotations

import yaml

from fleet.testing.binaries import REPO_ROOT
from tests.helpers.charts import CONTROLLER_CHART

DOC = (REPO_ROOT / "docs" / "operations.md").read_text()


def section(title: str) -> str:
    parts = DOC.split(f"\n## {title}\n", 1)
    assert len(parts) == 2, f"docs/operations.md has no section {title!r}"
    return parts[1].split("\n## ", 1)[0]


def crds() -> list[dict[str, str]]:
    out = []
    for f in sorted((CONTROLLER_CHART / "crds").glob("*.yaml")):
        d = yaml.safe_load(f.read_text())
        out.append({"name": d["metadata"]["name"], "kind": d["spec"]["names"]["kind"],
                    "plural": d["spec"]["names"]["plural"]})
    return out


def test_every_crd_is_in_what_gets_installed() -> None:
    text = section("What gets installed where")
    assert len(crds()) >= 2
    for c in crds():
        assert f"`{c['kind']}`" in text, c["kind"]


def test_upgrading_applies_the_crds_before_helm_upgrade() -> None:
    text = section("Upgrading k0s-fleet")
    apply = text.index("kubectl apply --server-side --force-conflicts -f charts/k0s-fleet/crds/")
    assert apply < text.index("helm upgrade k0s-fleet charts/k0s-fleet")


def test_uninstall_deletes_in_order_and_names_every_crd() -> None:
    text = section("Uninstall")
    # the numbered steps: FleetUpgrades, NodePlans, the releases, the CRDs
    order = [text.index("1. FleetUpgrades first"), text.index("delete fleetupgrades --all"),
             text.index("2. NodePlans"), text.index("delete nodeplans -A --all"),
             text.index("3. The releases"), text.index("kubectl delete crd ")]
    assert order == sorted(order)
    assert "helm uninstall k0s-fleet --namespace" in text
    delete_crd = text[order[5]:].split("`", 1)[0]
    for c in crds():
        assert c["name"] in delete_crd, c["name"]
