"""The agent chart's trust boundaries, as rendered (issue 29): the signal policy lets only
the node's own agent write the status, the own-node policy covers CREATE, and the
DaemonSet sets each variable once."""

from __future__ import annotations

from typing import Any

import yaml

from tests.helpers.charts import AGENT_CHART, OPTIONAL_APIS, helm, render, template_args


def _policy(name: str, sets: list[str] | None = None) -> dict[str, Any]:
    return render(AGENT_CHART, namespace="kfa", sets=sets or []).one(
        "ValidatingAdmissionPolicy", f"r1-k0s-fleet-agent-{name}")


def test_signal_policy_lets_only_the_nodes_own_agent_write_the_status() -> None:
    vap = _policy("signal-request")
    variables = {v["name"]: v["expression"] for v in vap["spec"]["variables"]}
    agent = variables["nodeAgent"]
    assert '"system:serviceaccount:kfa:r1-k0s-fleet-agent"' in agent
    assert "authentication.kubernetes.io/node-name" in agent and "n == request.name" in agent
    status_rules = [v for v in vap["spec"]["validations"]
                    if "variables.nodeAgent" in v["expression"]]
    assert [v["expression"] for v in status_rules] == [
        "variables.newData == variables.oldData || variables.nodeAgent"]
    assert status_rules[0]["reason"] == "Forbidden"
    extra = _policy("signal-request", ["signalPolicy.agentUsers[0]=controller-1-agent"])
    assert '["controller-1-agent"]' in {v["name"]: v["expression"] for v in
                                        extra["spec"]["variables"]}["nodeAgent"]


def test_own_node_policy_covers_create() -> None:
    (rule,) = _policy("own-node")["spec"]["matchConstraints"]["resourceRules"]
    assert rule["operations"] == ["CREATE", "UPDATE", "DELETE"]


class _StrictLoader(yaml.SafeLoader):
    """Refuses a mapping with a key twice (YAML parsers differ on which value wins)."""


def _no_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False
                   ) -> dict[Any, Any]:
    keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
    dupes = {k for k in keys if keys.count(k) > 1}
    assert not dupes, f"duplicate keys {dupes} at {node.start_mark}"
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def test_agent_chart_sets_every_key_once() -> None:
    out = helm("template", "r1", *template_args(AGENT_CHART, api_versions=OPTIONAL_APIS)).stdout
    docs = [d for d in yaml.load_all(out, Loader=_StrictLoader) if d]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    env = [e["name"] for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert len(env) == len(set(env))
