"""The controller chart validates ``values.fleet`` against the fleet YAML model itself.

``charts/k0s-fleet/values.schema.json`` embeds a JSON schema generated from
:class:`fleet.config.models.FleetConfig`, so a misspelt fleet key fails ``helm install`` (not
the controller's start-up, minutes later). This test keeps the two in step; when the
model changes, regenerate with

    .venv/bin/python -m tests.unit.test_chart_schema
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.config.loader import load_config
from fleet.config.models import FleetConfig
from fleet.testing.binaries import REPO_ROOT
from tests.helpers.charts import CONTROLLER_CHART, helm, render, template_args

SCHEMA_FILE = CONTROLLER_CHART / "values.schema.json"
PREFIX = "fleet."
EXAMPLE = REPO_ROOT / "config" / "fleet.example.yaml"


def _convert(node: Any) -> Any:
    """Pydantic's schema -> one helm can check and that is no stricter than the model."""
    if isinstance(node, list):
        return [_convert(x) for x in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for k, v in node.items():
        if k in ("title", "default"):  # noise, and defaults show Python's spellings
            continue
        if k == "$ref":
            out[k] = "#/definitions/" + PREFIX + v.removeprefix("#/$defs/")
        elif k in ("properties", "patternProperties", "$defs"):
            out[k] = {name: _convert(sub) for name, sub in v.items()}
        else:
            out[k] = _convert(v)
    if out.get("format") == "duration":
        # The model reads "90s", "1h30m" or a number of seconds.
        desc = out.get("description")
        out = {"anyOf": [{"type": "string", "minLength": 1}, {"type": "number", "minimum": 0}]}
        if desc:
            out["description"] = desc
    if "patternProperties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def fleet_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """(schema of values.fleet, definitions it refers to) from the model."""
    raw = FleetConfig.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    top = _convert(raw)
    top["description"] = ("The fleet YAML (see config/fleet.example.yaml); checked against "
                          "k0s-fleet's configuration model.")
    return top, {PREFIX + name: _convert(d) for name, d in sorted(defs.items())}


def regenerated(schema: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(schema)
    top, defs = fleet_schema()
    out["definitions"] = {k: v for k, v in out["definitions"].items()
                          if not k.startswith(PREFIX)} | defs
    out["properties"]["fleet"] = top
    return out


def test_chart_schema_embeds_the_current_fleet_model() -> None:
    current = json.loads(SCHEMA_FILE.read_text())
    assert current == regenerated(current), (
        "charts/k0s-fleet/values.schema.json is stale: run "
        "`.venv/bin/python -m tests.unit.test_chart_schema`")


def _template(tmp_path: Path, fleet: Any) -> tuple[int, str]:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"fleet": fleet}))
    proc = helm("template", "r1", *template_args(CONTROLLER_CHART, values), check=False)
    return proc.returncode, proc.stderr


GOOD_FLEET = {
    "clusters": {"namespaces": ["capi-prod"], "labelSelector": "env in (prod,staging)"},
    "rollout": {
        "waves": [
            {"name": "canary", "clusterSelector": {"matchLabels": {"ring": "0"}},
             "canary": True, "soakSeconds": "30m"},
            {"name": "rest", "maxConcurrentClusters": 5, "failureBudget": "10%",
             "soakSeconds": 600},
        ],
        "progressDeadlines": {"downloading": "15m", "restarting": 300},
    },
    "download": {"digests": {"v1.31.3+k0s.0": {"amd64": "a" * 64}}},
}


def test_a_valid_fleet_passes_both_helm_and_the_model(tmp_path: Path) -> None:
    FleetConfig.model_validate(GOOD_FLEET, by_alias=True, by_name=False)
    code, err = _template(tmp_path, GOOD_FLEET)
    assert code == 0, err


def test_the_example_fleet_yaml_installs_pasted_verbatim(tmp_path: Path) -> None:
    """config/fleet.example.yaml ("every key") under values.fleet, as it is: helm checks
    it against values.schema.json (the model's schema) and the chart renders it into the
    ConfigMap unchanged."""
    load_config(EXAMPLE, env={})
    fleet = yaml.safe_load(EXAMPLE.read_text())
    assert fleet["rollout"]["waves"]
    assert fleet["status"]["wedgedAfter"]  # a fleet.status key the chart does not set
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"fleet": fleet}))
    manifest = render(CONTROLLER_CHART, values)
    cm = manifest.one("ConfigMap", "r1-k0s-fleet")
    assert yaml.safe_load(cm["data"]["fleet.yaml"]) == fleet


CHART_SET = [
    {"management": {"namespace": "elsewhere"}},
    {"status": {"port": 9090}},
    {"extension": {"port": 9000}},
    {"extension": {"enabled": True}},
]


@pytest.mark.parametrize("fleet", CHART_SET, ids=[json.dumps(f) for f in CHART_SET])
def test_keys_the_chart_sets_are_refused_under_values_fleet(
        tmp_path: Path, fleet: dict[str, Any]) -> None:
    code, err = _template(tmp_path, fleet)
    assert code != 0 and "are set by the chart" in err, err


BAD_FLEETS = [
    ({"rolout": {}}, "additional properties 'rolout'"),
    ({"rollout": {"waves": [{"name": "a", "maxConcurentClusters": 2}]}},
     "'maxConcurentClusters'"),
    ({"rollout": {"maxConcurrentClusters": "many"}}, "/fleet/rollout/maxConcurrentClusters"),
    ({"executor": "ssh"}, "/fleet/executor"),
    ({"rollout": {"waves": [{"canary": True}]}}, "missing property 'name'"),
    ({"download": {"digests": {"v1.31.3+k0s.0": {"AMD64!": "x"}}}}, "'AMD64!'"),
]


@pytest.mark.parametrize(("fleet", "message"), BAD_FLEETS, ids=[m for _, m in BAD_FLEETS])
def test_fleet_mistakes_fail_at_install_as_they_would_in_the_controller(
        tmp_path: Path, fleet: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError):  # the model refuses it too
        FleetConfig.model_validate(fleet, by_alias=True, by_name=False)
    code, err = _template(tmp_path, fleet)
    assert code != 0
    assert message in err, err


if __name__ == "__main__":
    schema = regenerated(json.loads(SCHEMA_FILE.read_text()))
    SCHEMA_FILE.write_text(json.dumps(schema, indent=2) + "\n")
    print(f"wrote {SCHEMA_FILE}", file=sys.stderr)
