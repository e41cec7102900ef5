"""The agent chart says which of its values every k0s-fleet request overrides.

Each field of the per-request policy (fleet.contract.signal.NodePolicy, filled from the fleet
YAML's ``agent:`` section for every request: FleetConfig.agent.node_policy()) has an agent
chart value it overrides; that value must say so in charts/k0s-fleet-agent/values.yaml,
and the rendered DaemonSet must hand that value to the setting the policy overrides.
"""

from __future__ import annotations

from fleet.config.models import FleetConfig
from fleet.contract.signal import NodePolicy
from tests.helpers.charts import AGENT_CHART, pod_spec, render

# policy field -> (agent chart value, the agent's environment variable it sets)
OVERRIDES = {
    "drainTimeoutSeconds": ("drain.timeoutSeconds", "K0S_FLEET_AGENT_DRAIN_TIMEOUT"),
    "drainTimeoutAction": ("drain.onTimeout", "K0S_FLEET_AGENT_DRAIN_TIMEOUT_ACTION"),
    "verifyTimeoutSeconds": ("verify.timeoutSeconds", "K0S_FLEET_AGENT_VERIFY_TIMEOUT"),
}
MARK = "Overridden by every k0s-fleet request"


def comment_above(values_text: str, dotted: str) -> str:
    """The comment lines right above a (nested) key of a values file."""
    lines = values_text.splitlines()
    path = dotted.split(".")
    depth, start = 0, 0
    for i in range(len(lines)):
        if i < start:
            continue
        if lines[i].startswith("  " * depth + path[depth] + ":"):
            if depth == len(path) - 1:
                j, out = i - 1, []
                while j >= 0 and lines[j].strip().startswith("#"):
                    out.append(lines[j])
                    j -= 1
                return "\n".join(reversed(out))
            depth, start = depth + 1, i + 1
    raise AssertionError(f"{dotted} not in the agent chart's values.yaml")


def test_every_request_carries_the_policy_the_chart_values_stand_for() -> None:
    """Every request carries these policy fields (so the agent chart's values are only
    fallbacks). A policy field added without an agent chart value needs no entry here;
    one that has a value must be added to OVERRIDES."""
    sent = FleetConfig().agent.node_policy().model_dump(exclude_none=True)
    assert set(OVERRIDES) <= set(sent) <= set(NodePolicy.model_fields)


def test_the_values_every_request_overrides_say_so() -> None:
    text = (AGENT_CHART / "values.yaml").read_text()
    for field, (value, _) in OVERRIDES.items():
        assert MARK in comment_above(text, value), f"{value} (policy {field}) does not say so"
    assert MARK not in comment_above(text, "drain.enabled")
    assert MARK not in comment_above(text, "verify.requireNodeReady")


def test_the_overridden_values_are_the_settings_the_policy_overrides() -> None:
    sets = ("drain.timeoutSeconds=123", "drain.onTimeout=proceed", "verify.timeoutSeconds=77")
    (container,) = pod_spec(render(AGENT_CHART, sets=sets).workload())["containers"]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert [env[var] for _, var in OVERRIDES.values()] == ["123", "proceed", "77"]
