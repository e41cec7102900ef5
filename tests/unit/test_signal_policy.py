"""The per-request node policy: signal validation, compatibility, where it comes from
(fleet config -> NodePlan spec -> request) and how the agent weighs it against its own."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from fleet.agents.settings import AgentSettings
from fleet.config.models import FleetConfig
from fleet.contract.nodeplan import build_nodeplan, nodeplan_name
from fleet.contract.signal import (
    SIGNAL_DATA_KEY,
    DrainTimeoutAction,
    InvalidSignalError,
    NodePolicy,
    SignalState,
    SignalStatus,
    parse_signal,
    replace_status,
    signal_annotations,
)
from fleet.planner import plan
from fleet.planner.actions import SignalNode
from fleet.planner.simulate import bump
from fleet.world.model import nodeplan_from
from tests.helpers.planner import SETTINGS, V2, fleet, of, step

SHA = "a" * 64


def raw_request(policy: Any = None, **k0supdate: Any) -> str:
    update: dict[str, Any] = {"url": "https://r.example/k0s", "version": "v1.31.3",
                              "sha256": SHA, **k0supdate}
    if policy is not None:
        update["policy"] = policy
    return json.dumps({"planId": "ns/p", "created": "2026-11-30T10:00:00Z",
                       "command": {"id": 1, "k0supdate": update}})


def parse(raw: str) -> Any:
    return parse_signal({SIGNAL_DATA_KEY: raw})


# -- signal ------------------------------------------------------------------------------------
def test_policy_round_trips() -> None:
    pol = {"drainTimeoutSeconds": 90, "drainTimeoutAction": "proceed",
           "verifyTimeoutSeconds": 12.5}
    data = parse(raw_request(pol))
    assert data.command.k0supdate.policy == NodePolicy(
        drainTimeoutSeconds=90.0, drainTimeoutAction="proceed", verifyTimeoutSeconds=12.5)
    again = parse_signal(signal_annotations(data))
    assert again == data
    assert json.loads(data.to_json())["command"]["k0supdate"]["policy"] == {
        "drainTimeoutSeconds": 90.0, "drainTimeoutAction": "proceed",
        "verifyTimeoutSeconds": 12.5}


def test_partial_policy_leaves_the_rest_to_the_agent() -> None:
    data = parse(raw_request({"drainTimeoutAction": "fail"}))
    pol = data.command.k0supdate.policy
    assert pol == NodePolicy(drainTimeoutAction="fail")
    assert pol.drainTimeoutSeconds is None and pol.verifyTimeoutSeconds is None
    # and nothing of the absent keys is written back
    assert json.loads(data.to_json())["command"]["k0supdate"]["policy"] == {
        "drainTimeoutAction": "fail"}


def test_no_policy_is_none_and_not_serialised() -> None:
    data = parse(raw_request())
    assert data.command.k0supdate.policy is None
    assert "policy" not in json.loads(data.to_json())["command"]["k0supdate"]


@pytest.mark.parametrize(("policy", "key", "words"), [
    ({"drainTimeoutSeconds": 0}, "drainTimeoutSeconds", "greater than 0"),
    ({"drainTimeoutSeconds": -5}, "drainTimeoutSeconds", "greater than 0"),
    ({"drainTimeoutSeconds": 2592001}, "drainTimeoutSeconds", "less than or equal to 2592000"),
    ({"drainTimeoutSeconds": "30"}, "drainTimeoutSeconds", "valid number"),
    ({"drainTimeoutSeconds": True}, "drainTimeoutSeconds", "valid number"),
    ({"verifyTimeoutSeconds": 0}, "verifyTimeoutSeconds", "greater than 0"),
    ({"verifyTimeoutSeconds": 1e12}, "verifyTimeoutSeconds", "less than or equal to 2592000"),
    ({"verifyTimeoutSeconds": float("inf")}, "verifyTimeoutSeconds", "finite"),
    ({"verifyTimeoutSeconds": float("nan")}, "verifyTimeoutSeconds", "finite"),
    ({"drainTimeoutAction": "maybe"}, "drainTimeoutAction", "'fail' or 'proceed'"),
    ({"drainTimeoutAction": "FAIL"}, "drainTimeoutAction", "'fail' or 'proceed'"),
    ("proceed", "policy", "valid dictionary"),
    ([1], "policy", "valid dictionary"),
])
def test_invalid_policy_is_an_invalid_signal(policy: Any, key: str, words: str) -> None:
    with pytest.raises(InvalidSignalError) as e:
        parse(raw_request(policy))
    msg = str(e.value)
    assert f"command.k0supdate.policy{'' if key == 'policy' else '.' + key}:" in msg, msg
    assert words in msg, msg


def test_unknown_policy_keys_are_ignored() -> None:
    """A newer controller's keys do not make this agent reject the request."""
    data = parse(raw_request({"drainTimeoutSeconds": 5, "gracePeriodSeconds": 3}))
    assert data.command.k0supdate.policy == NodePolicy(drainTimeoutSeconds=5)


class _OldK0sUpdate(BaseModel):
    """K0sUpdateCommand as agents before the policy knew it."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    url: str
    version: str
    sha256: str | None = None
    forceupdate: bool = False
    allowunverified: bool = False


class _OldCommand(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    id: int = 0
    k0supdate: _OldK0sUpdate


def test_old_agent_ignores_the_policy_and_keeps_it_when_writing_status() -> None:
    raw = raw_request({"drainTimeoutSeconds": 5, "drainTimeoutAction": "proceed"})
    old = _OldCommand.model_validate(json.loads(raw)["command"])
    assert old.k0supdate.version == "v1.31.3"
    # the node side writes status by replacing only the status: the policy survives
    written = replace_status(raw, SignalStatus(status=SignalState.DOWNLOADING))
    data = parse(written)
    assert data.status.status is SignalState.DOWNLOADING
    assert data.command.k0supdate.policy == NodePolicy(drainTimeoutSeconds=5,
                                                       drainTimeoutAction="proceed")


# -- agent precedence --------------------------------------------------------------------------
def agent(**kw: Any) -> AgentSettings:
    return AgentSettings(node_name="n1", drain_timeout=300, verify_timeout=180,
                         drain_timeout_action=DrainTimeoutAction.FAIL, **kw)


def test_agent_without_a_request_policy_uses_its_own() -> None:
    eff = agent().policy_for(None)
    assert (eff.drain_timeout, eff.drain_timeout_action, eff.verify_timeout) == (
        300, DrainTimeoutAction.FAIL, 180)
    assert agent().policy_for(NodePolicy()) == eff


def test_request_policy_wins_over_the_agent() -> None:
    eff = agent().policy_for(NodePolicy(drainTimeoutSeconds=2, drainTimeoutAction="proceed",
                                        verifyTimeoutSeconds=30))
    assert (eff.drain_timeout, eff.drain_timeout_action, eff.verify_timeout) == (
        2, DrainTimeoutAction.PROCEED, 30)


def test_request_policy_wins_per_value() -> None:
    s = agent()
    eff = s.policy_for(NodePolicy(drainTimeoutAction="proceed"))
    assert (eff.drain_timeout, eff.drain_timeout_action, eff.verify_timeout) == (
        300, DrainTimeoutAction.PROCEED, 180)
    eff = s.policy_for(NodePolicy(verifyTimeoutSeconds=7))
    assert (eff.drain_timeout, eff.drain_timeout_action, eff.verify_timeout) == (
        300, DrainTimeoutAction.FAIL, 7)
    # the agent's own settings are untouched: the override is for that request only
    assert (s.drain_timeout, s.drain_timeout_action, s.verify_timeout) == (
        300, DrainTimeoutAction.FAIL, 180)


def test_request_policy_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("K0S_FLEET_AGENT_DRAIN_TIMEOUT_ACTION", "proceed")
    monkeypatch.setenv("K0S_FLEET_AGENT_VERIFY_TIMEOUT", "99")
    s = AgentSettings(node_name="n1")
    assert s.policy_for(None).drain_timeout_action is DrainTimeoutAction.PROCEED
    assert s.policy_for(None).verify_timeout == 99
    eff = s.policy_for(NodePolicy(drainTimeoutAction="fail", verifyTimeoutSeconds=5))
    assert eff.drain_timeout_action is DrainTimeoutAction.FAIL and eff.verify_timeout == 5


# -- controller side ---------------------------------------------------------------------------
def test_fleet_config_agent_section_becomes_the_policy() -> None:
    cfg = FleetConfig.model_validate({"agent": {
        "drainTimeout": "2m", "drainTimeoutAction": "proceed", "verifyTimeout": "90s"}})
    assert cfg.agent.node_policy() == NodePolicy(
        drainTimeoutSeconds=120, drainTimeoutAction="proceed", verifyTimeoutSeconds=90,
        deleteEmptyDirData=False, force=False)
    default = FleetConfig().agent.node_policy()
    assert default.drainTimeoutAction == "fail" and default.drainTimeoutSeconds == 300
    # the drain's consent is always sent, false unless the operator gives it
    assert default.deleteEmptyDirData is False and default.force is False


def test_fleet_config_refuses_a_timeout_no_request_could_carry() -> None:
    with pytest.raises(ValidationError, match="at most"):
        FleetConfig.model_validate({
            "rollout": {"progressDeadlines": {"cordoning": "1000h"}},
            "agent": {"drainTimeout": "721h"}})


MACHINE = {"metadata": {"name": "m1", "namespace": "ns", "uid": "u1"},
           "spec": {"clusterName": "c1"}}


def test_nodeplan_records_the_policy_durably() -> None:
    pol = NodePolicy(drainTimeoutSeconds=60, drainTimeoutAction="proceed",
                     verifyTimeoutSeconds=30)
    body = build_nodeplan(machine=MACHINE, node_name="n1", role="worker", version="v1.31.3",
                          url="https://r.example/k0s", sha256=SHA, node_policy=pol)
    assert body["spec"]["nodePolicy"] == {"drainTimeoutSeconds": 60.0,
                                          "drainTimeoutAction": "proceed",
                                          "verifyTimeoutSeconds": 30.0}
    assert nodeplan_from(body).node_policy == pol
    bare = build_nodeplan(machine=MACHINE, node_name="n1", role="worker", version="v1.31.3",
                          url="https://r.example/k0s", sha256=SHA)
    assert "nodePolicy" not in bare["spec"]
    assert nodeplan_from(bare).node_policy is None


@pytest.mark.parametrize("raw", [{}, None, "x", {"drainTimeoutSeconds": 0},
                                 {"drainTimeoutAction": "maybe"}])
def test_nodeplan_policy_the_signal_would_refuse_is_left_out(raw: Any) -> None:
    body = build_nodeplan(machine=MACHINE, node_name="n1", role="worker", version="v1.31.3",
                          url="https://r.example/k0s", sha256=SHA)
    body["spec"]["nodePolicy"] = raw
    assert nodeplan_from(body).node_policy is None


@pytest.mark.parametrize("executor", ["agent", "autopilot"])
def test_planner_signals_the_plans_policy_for_agents_only(executor: str) -> None:
    sim, ck = fleet(control_planes=0, workers=1, max_unavailable=1)
    bump(sim, ck, V2)
    step(sim)  # creates the plan
    key = ("default", nodeplan_name("c1-md-0", V2))
    pol = NodePolicy(drainTimeoutSeconds=45, drainTimeoutAction="proceed")
    sim.nodeplans[key] = dataclasses.replace(sim.nodeplans[key], node_policy=pol,
                                             executor=executor)
    signals: list[SignalNode] = []
    for _ in range(3):  # start, then signal
        actions = plan(sim.snapshot(), SETTINGS).actions
        signals += of(actions, SignalNode)
        # the simulator plays the agent protocol only: it gets the agent's signals
        sim.apply_all([a for a in actions if executor == "agent"
                       or not isinstance(a, SignalNode)])
    if executor == "autopilot":
        # stock k0s has no such fields (re-sent each pass: nothing answers here)
        assert signals and all(s.request.policy is None for s in signals)
        return
    [sig] = signals
    assert sig.request.policy == pol
    node = sim.nodes[ck]["c1-md-0"]  # type: ignore[index]
    assert node.signal is not None and node.signal.command.k0supdate.policy == pol
