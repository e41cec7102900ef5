"""Agent configuration: flags over environment, consistency checks, restart commands."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from fleet.agents import restart as restart_mod
from fleet.agents.restart import NSENTER, K0sProbe, Restarter, RestartError
from fleet.agents.settings import (
    AgentSettings,
    HostNamespace,
    RestartStrategy,
    environment_problems,
)
from fleet.cli import build_parser, main
from fleet.cli.agent import add_settings_flags
from fleet.config.models import NodePolicySettings
from fleet.contract.signal import POLICY_SETTINGS, misplaced_policy_variable

pytestmark = pytest.mark.anyio


def settings_from(argv: list[str]) -> AgentSettings:
    args = build_parser("agent").parse_args(["agent", *argv])
    return AgentSettings(**{k: v for k, v in vars(args).items() if k not in ("command", "func")})


def test_every_setting_has_a_flag_and_nothing_else_does() -> None:
    """The flags are generated from the settings model, so they cannot drift from it."""
    parser = argparse.ArgumentParser()
    add_settings_flags(parser, AgentSettings)
    dests = {a.dest for a in parser._actions if a.dest != "help"}
    assert dests == set(AgentSettings.model_fields)
    s = settings_from(["--node-name", "n", "--free-space-margin-bytes", "0",
                       "--no-require-node-ready", "--allow-unverified",
                       "--drain-timeout-action", "proceed", "--kubeconfig", ""])
    assert s.free_space_margin_bytes == 0 and not s.require_node_ready and s.allow_unverified
    assert s.drain_timeout_action == "proceed" and s.kubeconfig is None


def test_a_setting_without_a_flag_rule_is_refused_loudly() -> None:
    class Odd(BaseModel):
        labels: dict[str, str] = {}

    with pytest.raises(TypeError, match=r"Odd\.labels"):
        add_settings_flags(argparse.ArgumentParser(), Odd)


def test_flags_override_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("K0S_FLEET_AGENT_NODE_NAME", "from-env")
    monkeypatch.setenv("K0S_FLEET_AGENT_DRAIN_TIMEOUT", "42")
    monkeypatch.setenv("K0S_FLEET_AGENT_CRASH_AT", "ignored:by-settings")
    s = settings_from(["--drain-timeout", "7", "--file-url-root", "/a", "--file-url-root", "/b",
                       "--no-drain", "--status-socket", "", "--pid-file", "/run/k0s.pid",
                       "--version-source", "binary"])
    assert s.node_name == "from-env" and s.drain_timeout == 7 and not s.drain
    assert s.file_url_roots == (Path("/a"), Path("/b"))
    assert s.status_socket is None and s.unit == "k0sworker"


def test_variables_naming_no_setting_are_named() -> None:
    """pydantic-settings ignores a K0S_FLEET_AGENT_* variable naming no field; the agent
    names it instead, and the controller's two-underscore spelling of its agent: section
    points at the agent's own setting."""
    assert environment_problems({
        "K0S_FLEET_AGENT_NODE_NAME": "n", "K0S_FLEET_AGENT_CRASH_AT": "x:before",
        "k0s_fleet_agent_drain_timeout": "7", "K0S_FLEET_ROLLOUT__PAUSED": "1",
    }) == []
    assert environment_problems({
        "K0S_FLEET_AGENT__DRAIN_TIMEOUT_ACTION": "proceed",
        "K0S_FLEET_AGENT__VERIFY_TIMEOUT": "5m",
        "K0S_FLEET_AGENT__NODE_NAME": "n",
        "K0S_FLEET_AGENT_DRAIN_TIMEOUTS": "7",
    }) == [
        "K0S_FLEET_AGENT_DRAIN_TIMEOUTS: no such agent setting (the settings are "
        "K0S_FLEET_AGENT_<FLAG>, one per flag of k0s-fleet agent)",
        "K0S_FLEET_AGENT__DRAIN_TIMEOUT_ACTION: sets the fleet config's "
        "agent.drainTimeoutAction on the controller, not this agent; the agent's own "
        "setting is K0S_FLEET_AGENT_DRAIN_TIMEOUT_ACTION",
        "K0S_FLEET_AGENT__NODE_NAME: no such agent setting; did you mean "
        "K0S_FLEET_AGENT_NODE_NAME?",
        "K0S_FLEET_AGENT__VERIFY_TIMEOUT: sets the fleet config's agent.verifyTimeout on "
        "the controller, not this agent; the agent's own setting is "
        "K0S_FLEET_AGENT_VERIFY_TIMEOUT",
    ]


def test_node_policy_settings_have_one_name_on_both_sides() -> None:
    """The fleet config's agent: keys are the agent's own settings of the same name (the
    two variables differ only by an underscore), so the guard knows every pair."""
    assert {f.alias for f in NodePolicySettings.model_fields.values()} == set(
        POLICY_SETTINGS.values())
    assert set(NodePolicySettings.model_fields) == set(POLICY_SETTINGS)
    assert set(POLICY_SETTINGS) <= set(AgentSettings.model_fields)
    for setting in POLICY_SETTINGS:
        mine, the_controllers = f"K0S_FLEET_AGENT_{setting.upper()}", \
            f"K0S_FLEET_AGENT__{setting.upper()}"
        assert misplaced_policy_variable(mine, on_agent=True) is None
        assert misplaced_policy_variable(the_controllers, on_agent=False) is None
        for var, on_agent in ((the_controllers, True), (mine, False)):
            line = misplaced_policy_variable(var, on_agent=on_agent)
            other = mine if on_agent else the_controllers
            assert line is not None and line.endswith(f" {other}"), line
            assert f"agent.{POLICY_SETTINGS[setting]}" in line
    assert misplaced_policy_variable("K0S_FLEET_AGENT_NODE_NAME", on_agent=False) is None
    assert misplaced_policy_variable("K0S_FLEET_ROLLOUT__PAUSED", on_agent=True) is None


def test_agent_command_refuses_a_misnamed_variable(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("K0S_FLEET_AGENT_NODE_NAME", "n")
    monkeypatch.setenv("K0S_FLEET_AGENT__DRAIN_TIMEOUT", "5m")
    assert main(["agent"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("k0s-fleet agent: K0S_FLEET_AGENT__DRAIN_TIMEOUT: ")
    assert line.endswith("the agent's own setting is K0S_FLEET_AGENT_DRAIN_TIMEOUT")


@pytest.mark.parametrize(("argv", "needle"), [
    (["--restart-strategy", "command"], "restart_command"),
    (["--status-socket", "", "--version-source", "status-socket"], "status_socket"),
    (["--status-socket", "", "--version-source", "binary"], "status_socket or pid_file"),
    (["--drain-timeout", "0"], "greater than 0"),
])
def test_inconsistent_settings_are_refused(argv: list[str], needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        settings_from(["--node-name", "n", *argv])


async def test_systemd_restart_goes_through_nsenter(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    async def fake_run(argv: list[str], *, timeout: float = 60.0) -> tuple[int, str]:
        calls.append(argv)
        return (0, "4242") if "show" in argv else (0, "")

    monkeypatch.setattr(restart_mod, "run_command", fake_run)
    s = AgentSettings(node_name="n", restart_strategy=RestartStrategy.SYSTEMD, role="controller",
                      host_namespace=HostNamespace.ALWAYS, status_socket=None,
                      version_source="binary")
    await Restarter(s).restart(None)
    assert calls[-1] == [*NSENTER, "systemctl", "restart", "k0scontroller"]
    assert await K0sProbe(s).pid() == 4242
    assert calls[-1][:len(NSENTER)] == list(NSENTER)

    never = s.model_copy(update={"host_namespace": HostNamespace.NEVER})
    await Restarter(never).restart(None)
    assert calls[-1] == ["systemctl", "restart", "k0scontroller"]


async def test_failed_restart_command_is_an_error(tmp_path: Path) -> None:
    s = AgentSettings(node_name="n", restart_strategy=RestartStrategy.COMMAND,
                      restart_command="sh -c 'echo nope >&2; exit 3'",
                      host_namespace=HostNamespace.NEVER, status_socket=tmp_path / "s")
    with pytest.raises(RestartError, match="exited 3: nope"):
        await Restarter(s).restart(None)
    missing = s.model_copy(update={"restart_command": "/nonexistent/restart-k0s"})
    with pytest.raises(RestartError, match="exited 127"):
        await Restarter(missing).restart(None)


async def test_signal_strategy_without_a_process(tmp_path: Path) -> None:
    s = AgentSettings(node_name="n", status_socket=tmp_path / "missing.sock")
    assert "init system" in await Restarter(s).restart(None)
    assert await K0sProbe(s).running() is None
    assert await K0sProbe(s).pid() is None


def test_allowed_url_prefixes_from_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("K0S_FLEET_AGENT_NODE_NAME", "n")
    default = settings_from([]).allowed_url_prefixes
    assert default[0] == "https://get.k0sproject.io/"
    assert all(p.startswith("https://") for p in default)  # no hop may go to clear text
    monkeypatch.setenv("K0S_FLEET_AGENT_ALLOWED_URL_PREFIXES", '["https://m.example/k0s/"]')
    assert settings_from([]).allowed_url_prefixes == ("https://m.example/k0s/",)
    monkeypatch.setenv("K0S_FLEET_AGENT_ALLOWED_URL_PREFIXES", '["https://m.example/k0s/"]')
    s = settings_from(["--allowed-url-prefix", "https://a.example/",
                       "--allowed-url-prefix", "http://b.example:8080/k0s"])
    assert s.allowed_url_prefixes == ("https://a.example/", "http://b.example:8080/k0s")
    assert AgentSettings(node_name="n", allowed_url_prefixes="https://a.example/, "
                         "https://b.example/").allowed_url_prefixes == (
        "https://a.example/", "https://b.example/")


@pytest.mark.parametrize("prefix", ["ftp://x.example/", "https://u@x.example/", "x.example"])
def test_an_unusable_allowed_url_prefix_is_named(prefix: str) -> None:
    with pytest.raises(ValidationError, match="allowed URL prefix"):
        settings_from(["--node-name", "n", "--allowed-url-prefix", prefix])
