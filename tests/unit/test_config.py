"""The fleet configuration: loading, environment overrides, and one-line-per-problem errors."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from fleet.agents.settings import DEFAULT_RELEASE_PREFIX
from fleet.agents.state import url_under_prefix
from fleet.cli.common import fleet_config
from fleet.config.errors import ConfigError
from fleet.config.loader import load_config
from fleet.config.models import (
    DEFAULT_URL_TEMPLATE,
    DownloadSettings,
    Executor,
    FleetConfig,
)
from fleet.config.schedule import format_duration
from fleet.config.types import FailureBudget
from fleet.contract.selectors import parse_label_selector
from fleet.contract.signal import DrainTimeoutAction, SignalState

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "fleet.example.yaml"
SHA_A = "a" * 64
SHA_B = "b" * 64


Write = Callable[[str], str]


@pytest.fixture
def write(tmp_path: Path) -> Write:
    def _write(text: str) -> str:
        p = tmp_path / "fleet.yaml"
        p.write_text(textwrap.dedent(text))
        return str(p)

    return _write


def problems(path: str | None, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_config(path, env=env or {})
    lines = str(e.value).splitlines()
    assert len(lines) == len(e.value.problems)
    return lines


# ------------------------------------------------------------------------------ loading


def test_defaults_without_a_file() -> None:
    cfg = load_config(None, env={})
    assert cfg == FleetConfig()
    assert cfg.executor is Executor.AGENT
    assert cfg.management.kubeconfig is None
    assert cfg.rollout.max_concurrent_clusters == 1
    assert cfg.rollout.failure_budget == 1
    assert cfg.download.url_template == DEFAULT_URL_TEMPLATE
    assert cfg.download.arches == ["amd64", "arm64", "arm"]
    assert not cfg.download.allow_unverified
    assert cfg.telemetry.service_name is None  # OTEL_SERVICE_NAME, else k0s-fleet
    assert cfg.extension.port == 9443
    assert cfg.status.port == 8080
    assert [w.name for w in cfg.rollout.effective_waves] == ["default"]


def test_default_constructor_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("K0S_FLEET_EXECUTOR", "autopilot")
    assert FleetConfig().executor is Executor.AGENT
    assert load_config(None).executor is Executor.AUTOPILOT  # os.environ by default


def test_empty_file(write: Write) -> None:
    assert load_config(write(""), env={}) == FleetConfig()
    assert load_config(write("# only a comment\n"), env={}) == FleetConfig()


def test_minimal_file(write: Write) -> None:
    path = write(
        """
        executor: autopilot
        rollout:
          maxConcurrentClusters: 3
          waves: [{name: canary, canary: true, clusterSelector: {matchLabels: {ring: "0"}}}]
        """
    )
    cfg = load_config(path, env={})
    assert cfg.executor is Executor.AUTOPILOT
    assert cfg.rollout.max_concurrent_clusters == 3
    assert [w.name for w in cfg.rollout.effective_waves] == ["canary", "default"]
    assert cfg.download == DownloadSettings()


def test_path_from_environment(write: Write) -> None:
    path = write("executor: autopilot\n")
    assert load_config(env={"K0S_FLEET_CONFIG": path}).executor is Executor.AUTOPILOT


def test_explicit_path_wins_over_environment_path(write: Write, tmp_path: Path) -> None:
    path = write("executor: autopilot\n")
    other = tmp_path / "missing.yaml"
    assert load_config(path, env={"K0S_FLEET_CONFIG": str(other)}).executor is Executor.AUTOPILOT


def test_example_file_loads() -> None:
    cfg = load_config(EXAMPLE, env={})
    assert [w.name for w in cfg.rollout.effective_waves] == [
        "canary",
        "staging",
        "production",
        "default",
    ]
    assert cfg.rollout.waves[0].canary
    assert cfg.rollout.waves[1].soak == timedelta(minutes=10)
    assert cfg.rollout.waves[2].failure_budget == FailureBudget(10, percent=True)
    assert cfg.agent.drain_timeout_action is DrainTimeoutAction.FAIL
    assert not cfg.extension.enabled  # set by the chart: commented out in the example
    assert cfg.clusters.entry_for("fleet-prod", "edge-01") is not None
    assert len(cfg.rollout.maintenance_windows) == 2


def test_dump_and_reload_round_trip(tmp_path: Path) -> None:
    cfg = load_config(EXAMPLE, env={})
    dumped = cfg.model_dump(mode="json", by_alias=True)
    p = tmp_path / "again.yaml"
    p.write_text(yaml.safe_dump(dumped))
    assert load_config(p, env={}) == cfg
    assert dumped["rollout"]["waves"][0]["soakSeconds"] == "30m"
    assert dumped["rollout"]["waves"][2]["failureBudget"] == "10%"


def test_json_schema_is_available() -> None:
    schema = FleetConfig.model_json_schema(by_alias=True)
    assert "rollout" in schema["properties"]


# ------------------------------------------------------------------ environment overrides


def test_env_overrides_nested_key_and_wins_over_file(write: Write) -> None:
    path = write(
        """
        rollout:
          maxConcurrentClusters: 2
          paused: false
        """
    )
    cfg = load_config(
        path,
        env={
            "K0S_FLEET_ROLLOUT__MAX_CONCURRENT_CLUSTERS": "7",
            "K0S_FLEET_ROLLOUT__PAUSED": "true",
            "K0S_FLEET_ROLLOUT__PROGRESSDEADLINES__APPLYINGUPDATE": "90",
            "K0S_FLEET_TELEMETRY__OTLP_ENDPOINT": "http://collector:4318",
        },
    )
    assert cfg.rollout.max_concurrent_clusters == 7
    assert cfg.rollout.paused is True
    assert cfg.rollout.progress_deadlines.applying_update == timedelta(seconds=90)
    assert cfg.telemetry.otlp_endpoint == "http://collector:4318"


def test_env_structured_values_and_top_level_scalar() -> None:
    cfg = load_config(
        None,
        env={
            "K0S_FLEET_EXECUTOR": "autopilot",
            "K0S_FLEET_ROLLOUT__WAVES": '[{"name": "a", "soakSeconds": "10m"}]',
            "K0S_FLEET_CLUSTERS__NAMESPACES": "[ns-a, ns-b]",
            "K0S_FLEET_MANAGEMENT": "{namespace: ops}",
        },
    )
    assert cfg.executor is Executor.AUTOPILOT
    assert cfg.rollout.waves[0].soak == timedelta(minutes=10)
    assert cfg.clusters.namespaces == ["ns-a", "ns-b"]
    assert cfg.management.namespace == "ops"


def test_env_empty_string_clears_an_optional_key(write: Write) -> None:
    path = write("management: {kubeconfig: /etc/kubeconfig}\n")
    cfg = load_config(path, env={"K0S_FLEET_MANAGEMENT__KUBECONFIG": ""})
    assert cfg.management.kubeconfig is None


def test_foreign_prefixed_variables_are_left_alone() -> None:
    env = {"K0S_FLEET_TIMINGS": "/tmp/x", "K0S_FLEET_NODE_NAME": "n1", "PATH": "/bin"}
    assert load_config(None, env=env) == FleetConfig()


def test_env_agent_process_spelling_on_the_controller_is_an_error() -> None:
    """K0S_FLEET_AGENT_X is the agent process's; the config's agent: section is
    K0S_FLEET_AGENT__X. The mix-up is named, not silently ignored."""
    [line] = problems(None, {"K0S_FLEET_AGENT_DRAIN_TIMEOUT": "5m"})
    assert line.startswith("K0S_FLEET_AGENT_DRAIN_TIMEOUT: ")
    assert "K0S_FLEET_AGENT__DRAIN_TIMEOUT" in line and "agent.drainTimeout" in line
    cfg = load_config(None, env={"K0S_FLEET_AGENT__DRAIN_TIMEOUT": "5m",
                                 "K0S_FLEET_AGENT_NODE_NAME": "n1"})  # the agent's: left alone
    assert cfg.agent.drain_timeout == timedelta(minutes=5)


def test_env_unknown_keys_are_errors_reported_with_the_rest() -> None:
    """pydantic-settings' source ignores variables naming no field; here they are errors,
    reported together with every other problem of the environment."""
    assert problems(None, {"K0S_FLEET_ROLLOUT__WAVEZ": "[]", "K0S_FLEET_ROLOUT__PAUSED": "1",
                           "K0S_FLEET_ROLLOUT__PROGRESS_DEADLINES__COOKING": "1m",
                           "K0S_FLEET_STATUS__PORT": "http"}) == [
        "rolout: unknown key (from K0S_FLEET_ROLOUT__PAUSED)",
        "rollout.progressDeadlines.cooking: unknown key "
        "(from K0S_FLEET_ROLLOUT__PROGRESS_DEADLINES__COOKING)",
        "rollout.wavez: unknown key (from K0S_FLEET_ROLLOUT__WAVEZ)",
        "status.port: must be an integer (got 'http') (from K0S_FLEET_STATUS__PORT)",
    ]


def test_env_problem_names_key_and_variable() -> None:
    assert problems(None, {"K0S_FLEET_ROLLOUT__MAX_CONCURRENT_CLUSTERS": "0"}) == [
        "rollout.maxConcurrentClusters: must be >= 1 "
        "(from K0S_FLEET_ROLLOUT__MAX_CONCURRENT_CLUSTERS)"
    ]
    assert problems(None, {"K0S_FLEET_ROLLOUT__PAUSED__X": "1"}) == [
        "rollout.paused: must be true or false (got {'x': '1'}) "
        "(from K0S_FLEET_ROLLOUT__PAUSED__X)"
    ]
    assert problems(None, {"K0S_FLEET_AGENT__DRAIN_TIMEOUT": "1h"}) == [
        "agent.drainTimeout: must be shorter than rollout.progressDeadlines.cordoning "
        "(1h >= 15m) (from K0S_FLEET_AGENT__DRAIN_TIMEOUT)"
    ]


def test_env_bad_yaml_value_is_one_line_naming_key_and_variable() -> None:
    [line] = problems(None, {"K0S_FLEET_ROLLOUT__WAVES": "[{name: a}", "K0S_FLEET_X": "["})
    assert line.startswith("rollout.waves: line 1, column ")
    assert "invalid YAML/JSON" in line and line.endswith("(from K0S_FLEET_ROLLOUT__WAVES)")
    [line] = problems(None, {"K0S_FLEET_MANAGEMENT": "{namespace: a, namespace: b}"})
    assert "duplicate key 'namespace'" in line and line.startswith("management: ")


def test_env_key_spellings_and_case() -> None:
    """A segment names a key with or without underscores, in any case; what reaches the
    model is the file's camelCase key, whichever spelling the variable used."""
    for var in ("K0S_FLEET_ROLLOUT__MAX_CONCURRENT_CLUSTERS",
                "K0S_FLEET_ROLLOUT__MAXCONCURRENTCLUSTERS",
                "k0s_fleet_rollout__maxConcurrentClusters"):
        assert load_config(None, env={var: "4"}).rollout.max_concurrent_clusters == 4, var
    cfg = load_config(None, env={"K0S_FLEET_DOWNLOAD__DIGEST_MANIFEST_URL": "https://m/{version}",
                                 "K0S_FLEET_CLUSTERS__LABEL_SELECTOR": "a=b"})
    assert cfg.download.digest_manifest_url == "https://m/{version}"
    assert cfg.clusters.label_selector == "a=b"


def test_env_two_spellings_of_one_key_are_refused() -> None:
    assert problems(None, {"K0S_FLEET_ROLLOUT__PAUSED": "true",
                           "K0S_FLEET_ROLLOUT__PAUSED_": "false"}) == [
        "K0S_FLEET_ROLLOUT__PAUSED_: sets the same key as K0S_FLEET_ROLLOUT__PAUSED"
    ]


def test_env_empty_value_keeps_a_required_string(write: Write) -> None:
    """Only an optional key is cleared by an empty value; others are validated as ''."""
    path = write("clusters: {labelSelector: 'a=b'}\nmanagement: {context: c}\n")
    cfg = load_config(path, env={"K0S_FLEET_CLUSTERS__LABEL_SELECTOR": "",
                                 "K0S_FLEET_MANAGEMENT": "{context: ''}"})
    assert cfg.clusters.label_selector == ""
    assert cfg.management.context is None
    assert problems(None, {"K0S_FLEET_STATUS__PORT": ""}) == [
        "status.port: must be an integer (got '') (from K0S_FLEET_STATUS__PORT)"
    ]


def test_sources_in_order_overrides_then_environment_then_file(write: Write) -> None:
    """init (the caller's overrides) > environment > file, merged section by section:
    what a higher source leaves out of a section comes from the lower ones."""
    path = write("management: {kubeconfig: /file, context: file-ctx, namespace: ops}\n"
                 "rollout: {maxConcurrentClusters: 2}\n")
    env = {"K0S_FLEET_MANAGEMENT__CONTEXT": "env-ctx", "K0S_FLEET_MANAGEMENT__KUBECONFIG": "/env"}
    cfg = load_config(path, env=env, overrides={"management": {"kubeconfig": "/flag"}})
    assert (cfg.management.kubeconfig, cfg.management.context, cfg.management.namespace) == (
        "/flag", "env-ctx", "ops")
    assert cfg.rollout.max_concurrent_clusters == 2
    assert type(cfg) is FleetConfig and cfg == load_config(path, env={**env, **{
        "K0S_FLEET_MANAGEMENT__KUBECONFIG": "/flag"}})


def test_overrides_are_validated_like_the_rest() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, env={}, overrides={"management": {"namespace": "Not_A_Label"}})
    [line] = str(e.value).splitlines()
    assert line == ("management.namespace: 'Not_A_Label' is not a valid DNS label "
                    "(lowercase a-z, 0-9, '-', <= 63)")


def test_cli_kubeconfig_and_context_flags_override_the_config(write: Write) -> None:
    path = write("management: {kubeconfig: /file, context: file-ctx}\n")
    args = argparse.Namespace(config=path, kubeconfig="/flag", context=None)
    cfg = fleet_config(args)
    assert (cfg.management.kubeconfig, cfg.management.context) == ("/flag", "file-ctx")
    args = argparse.Namespace(config=path, kubeconfig=None, context=None)
    assert fleet_config(args) == load_config(path)


# -------------------------------------------------------------------------------- errors


def test_missing_file(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.yaml")
    assert problems(missing) == [f"{missing}: config file not found"]


def test_yaml_syntax_error_names_the_line(write: Write) -> None:
    path = write("rollout:\n  paused: [true\n")
    (line,) = problems(path)
    assert line.startswith(f"{path}: line ")
    assert "invalid YAML" in line


def test_duplicate_yaml_key(write: Write) -> None:
    path = write("rollout:\n  paused: true\n  paused: false\n")
    assert problems(path) == [f"{path}: line 3, column 3: invalid YAML: duplicate key 'paused'"]


def test_top_level_must_be_a_mapping(write: Write) -> None:
    path = write("- a\n- b\n")
    assert problems(path) == [f"{path}: must be a YAML mapping at the top (got list)"]


def test_unknown_keys_everywhere(write: Write) -> None:
    path = write(
        """
        rolout: {}
        rollout:
          waves:
            - name: a
              clusterSelector: {matchLabel: {a: b}}
        download: {digest: {}}
        """
    )
    assert problems(path) == [
        "rollout.waves[0].clusterSelector.matchLabel: unknown key",
        "download.digest: unknown key",
        "rolout: unknown key",
    ]


def test_snake_case_keys_are_not_accepted_in_yaml(write: Write) -> None:
    path = write("rollout: {max_concurrent_clusters: 2}\n")
    assert problems(path) == ["rollout.max_concurrent_clusters: unknown key"]


def test_wrong_types(write: Write) -> None:
    path = write(
        """
        executor: ansible
        rollout:
          paused: maybe
          waves:
            - name: a
              maxConcurrentClusters: two
          maintenanceWindows: {}
        status: {port: http}
        """
    )
    assert problems(path) == [
        "executor: must be one of 'agent' or 'autopilot' (got 'ansible')",
        "rollout.waves[0].maxConcurrentClusters: must be an integer (got 'two')",
        "rollout.maintenanceWindows: must be a list (got {})",
        "rollout.paused: must be true or false (got 'maybe')",
        "status.port: must be an integer (got 'http')",
    ]


def test_impossible_values_reported_together(write: Write) -> None:
    path = write(
        """
        rollout:
          maxConcurrentClusters: 1
          failureBudget: 0
          waves:
            - name: first
              maxConcurrentClusters: 2
            - name: second
              maxConcurrentClusters: 0
              soakSeconds: -5
          progressDeadlines: {verifying: 0s}
        telemetry: {samplingRatio: 1.5}
        extension: {port: 70000}
        """
    )
    assert problems(path) == [
        "rollout.waves[1].maxConcurrentClusters: must be >= 1",
        "rollout.waves[1].soakSeconds: must be >= 0s (got -5s)",
        "rollout.progressDeadlines.verifying: must be > 0s (got 0s)",
        "rollout.failureBudget: must be >= 1",
        "telemetry.samplingRatio: must be <= 1.0",
        "extension.port: must be <= 65535",
    ]


def test_names_and_labels(write: Write) -> None:
    path = write(
        """
        management: {namespace: Not_A_Namespace}
        clusters:
          namespaces: [a, a]
          labelSelector: "env in prod"
          entries:
            - {name: c1, namespace: ns}
            - {name: c1, namespace: ns}
            - {name: "-bad", labels: {"bad key!": v}}
        rollout:
          waves:
            - name: w
              clusterSelector:
                matchExpressions:
                  - {key: env, operator: In}
                  - {key: env, operator: Exists, values: [x]}
                  - {key: env, operator: Near, values: [x]}
            - name: w
            - name: default
              clusterSelector: {matchLabels: {a: b}}
        """
    )
    lines = problems(path)
    assert lines[0].startswith("management.namespace: 'Not_A_Namespace' is not a valid DNS label")
    assert lines[1:] == [
        "clusters.labelSelector: cannot parse label selector 'env in prod' at 'env in prod'",
        "clusters.entries[2].name: '-bad' is not a valid Kubernetes object name (DNS subdomain)",
        "clusters.entries[2].labels[\"bad key!\"]: 'bad key!' is not a valid label key",
        "rollout.waves[0].clusterSelector.matchExpressions[0].values: "
        "must not be empty for operator In",
        "rollout.waves[0].clusterSelector.matchExpressions[1].values: "
        "must be empty for operator Exists",
        "rollout.waves[0].clusterSelector.matchExpressions[2].operator: "
        "must be one of 'In', 'NotIn', 'Exists' or 'DoesNotExist' (got 'Near')",
    ]
    # Duplicates are checked once the pieces themselves are valid.
    path = write(
        """
        clusters:
          namespaces: [a, a]
          entries: [{name: c1, namespace: ns}, {name: c1, namespace: ns}]
        rollout:
          waves: [{name: w}, {name: w}, {name: default, clusterSelector: {matchLabels: {a: b}}}]
        """
    )
    assert problems(path) == [
        "clusters.namespaces[1]: duplicate namespace 'a'",
        "clusters.entries[1]: duplicate of entries[0] (ns/c1)",
        "rollout.waves[1].name: duplicate wave name 'w' (waves[0])",
        "rollout.waves[2].name: 'default' is reserved for the wave of all remaining clusters; "
        "give it an empty clusterSelector or another name",
    ]


def test_cross_section_checks(write: Write) -> None:
    path = write(
        """
        agent: {drainTimeout: 20m, verifyTimeout: 10m}
        extension: {enabled: true, port: 8080, certFile: c}
        """
    )
    assert problems(path) == [
        "extension.keyFile: required when extension.enabled is true",
    ]
    path = write(
        """
        agent: {drainTimeout: 20m, verifyTimeout: 10m}
        extension: {enabled: true, port: 8080, certFile: c, keyFile: k}
        """
    )
    assert problems(path) == [
        "agent.drainTimeout: must be shorter than rollout.progressDeadlines.cordoning (20m >= 15m)",
        "agent.verifyTimeout: must be shorter than rollout.progressDeadlines.verifying "
        "(10m >= 10m)",
        "extension.port: must differ from status.port (8080)",
    ]
    assert problems(None, {"K0S_FLEET_EXTENSION__MODE": "always"}) == [
        "extension.mode: 'always' needs extension.enabled: true (from K0S_FLEET_EXTENSION__MODE)"
    ]


def test_maintenance_window_errors(write: Write) -> None:
    path = write(
        """
        rollout:
          maintenanceWindows:
            - {schedule: "0 25 * * *", duration: 1h}
            - {schedule: "0 0 30 2 *", duration: 0, timeZone: Europe/Atlantis}
            - {schedule: "@daily"}
        """
    )
    assert problems(path) == [
        "rollout.maintenanceWindows[0].schedule: hour field: 25 is out of range 0-23 in "
        "'0 25 * * *'",
        "rollout.maintenanceWindows[1].schedule: cron expression '0 0 30 2 *' never matches "
        "a real date",
        "rollout.maintenanceWindows[1].duration: must be > 0s (got 0s)",
        "rollout.maintenanceWindows[1].timeZone: unknown time zone 'Europe/Atlantis' "
        "(expected an IANA name)",
        "rollout.maintenanceWindows[2].duration: required",
    ]


def test_download_errors(write: Write) -> None:
    path = write(
        f"""
        download:
          urlTemplate: "https://example.com/{{version}}/k0s"
          digestManifestUrl: "ftp://example.com/{{version}}/sums"
          digests:
            v1.31.3+k0s.0: {{amd64: "{SHA_A[:-1]}"}}
            latest: {{amd64: "{SHA_A}"}}
          arches: [amd64, "x86 64"]
        """
    )
    assert problems(path) == [
        "download.urlTemplate: must contain {arch} (got 'https://example.com/{version}/k0s')",
        'download.digests["v1.31.3+k0s.0"].amd64: must be 64 hex characters '
        f"(got '{SHA_A[:-1]}')",
        "download.digests.latest: not a k0s version: 'latest' (expected e.g. v1.31.3+k0s.0)",
        "download.digestManifestUrl: URL scheme 'ftp' not allowed; use one of file, http, https",
        "download.arches[1]: must match ^[a-z0-9_]+$ (got 'x86 64')",
    ]
    path = write(
        f"""
        download:
          urlTemplate: "https://example.com/{{version}}/{{os}}/{{arch}}"
          digests: {{v1.31.3: {{amd64: "{SHA_A}"}}, v1.31.3+k0s.0: {{amd64: "{SHA_A}"}}}}
        """
    )
    assert problems(path) == [
        "download.urlTemplate: unknown placeholder(s) {os}; allowed: {arch}, {version}",
        "download.digests: 'v1.31.3' and 'v1.31.3+k0s.0' name the same k0s version",
    ]


# ------------------------------------------------------------------ durations and budgets


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (0, timedelta(0)),
        (90, timedelta(seconds=90)),
        ("10m", timedelta(minutes=10)),
        ("1h30m", timedelta(minutes=90)),
        ("2.5", timedelta(seconds=2.5)),
    ],
)
def test_soak_accepts_seconds_and_durations(raw: object, expected: timedelta) -> None:
    cfg = FleetConfig.model_validate({"rollout": {"waves": [{"name": "w", "soakSeconds": raw}]}})
    assert cfg.rollout.waves[0].soak == expected


@given(st.timedeltas(min_value=timedelta(seconds=1), max_value=timedelta(days=30)))
def test_duration_fields_round_trip_through_json(td: timedelta) -> None:
    cfg = FleetConfig.model_validate(
        {
            "agent": {"drainTimeout": format_duration(td)},
            "rollout": {"progressDeadlines": {"cordoning": "1000h"}},
        }
    )
    dumped = cfg.model_dump(mode="json", by_alias=True)
    assert dumped["agent"]["drainTimeout"] == format_duration(td)
    assert FleetConfig.model_validate(dumped) == cfg


@pytest.mark.parametrize(
    ("raw", "total", "tolerated"),
    [
        (0, 10, 0),
        (3, 10, 3),
        ("3", 10, 3),
        ("10%", 25, 2),
        ("10%", 9, 0),
        ("100%", 7, 7),
        ("0%", 100, 0),
        (" 50 % ", 5, 2),
    ],
)
def test_percent_budgets(raw: object, total: int, tolerated: int) -> None:
    cfg = FleetConfig.model_validate({"rollout": {"waves": [{"name": "w", "failureBudget": raw}]}})
    assert cfg.rollout.waves[0].tolerated_failures(total) == tolerated


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (-1, "must be >= 0 (got -1)"),
        ("150%", "must be <= 100% (got 150%)"),
        ("1.5%", "must be a count or a percentage such as '10%' (got '1.5%')"),
        (True, "must be a count or a percentage such as '10%' (got True)"),
        ("many", "must be a count or a percentage such as '10%' (got 'many')"),
    ],
)
def test_bad_budgets(raw: object, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(
            None,
            env={"K0S_FLEET_ROLLOUT__WAVES": yaml.safe_dump([{"name": "w", "failureBudget": raw}])},
        )
    assert (
        str(e.value) == f"rollout.waves[0].failureBudget: {message} (from K0S_FLEET_ROLLOUT__WAVES)"
    )


def test_canary_tolerates_no_failure() -> None:
    cfg = FleetConfig.model_validate({"rollout": {"waves": [{"name": "c", "canary": True}]}})
    assert cfg.rollout.waves[0].tolerated_failures(100) == 0
    assert problems(
        None, {"K0S_FLEET_ROLLOUT__WAVES": '[{name: c, canary: true, failureBudget: "5%"}]'}
    ) == [
        "rollout.waves[0].failureBudget: must be 0 in a canary wave (got 5%) "
        "(from K0S_FLEET_ROLLOUT__WAVES)"
    ]


def test_progress_deadlines_per_phase() -> None:
    d = FleetConfig().rollout.progress_deadlines
    assert d.for_state(None) == d.pending == timedelta(minutes=5)
    assert d.for_state(SignalState.CORDONING) == d.cordoning
    assert d.for_state("UnCordoning") == d.un_cordoning
    assert d.for_state(SignalState.COMPLETED) is None
    assert d.for_state("NotAState") is None
    for phase in ("Downloading", "ApplyingUpdate", "Restarting", "Verifying"):
        assert d.for_state(phase) is not None


# --------------------------------------------------------------------- waves and clusters


def test_wave_assignment_and_default_wave() -> None:
    cfg = FleetConfig.model_validate(
        {
            "rollout": {
                "maxConcurrentClusters": 4,
                "waves": [
                    {
                        "name": "canary",
                        "canary": True,
                        "clusterSelector": {"matchLabels": {"ring": "0"}},
                    },
                    {
                        "name": "eu",
                        "maxConcurrentClusters": 2,
                        "clusterSelector": {
                            "matchExpressions": [
                                {
                                    "key": "region",
                                    "operator": "In",
                                    "values": ["eu-west", "eu-north"],
                                },
                                {"key": "legacy", "operator": "DoesNotExist"},
                            ]
                        },
                    },
                ],
            }
        }
    )
    r = cfg.rollout
    assert r.wave_for({"ring": "0", "region": "eu-west"}).name == "canary"
    assert r.wave_for({"region": "eu-west"}).name == "eu"
    assert r.wave_for({"region": "eu-west", "legacy": "yes"}).name == "default"
    assert r.wave_for({}).name == "default"
    assert r.concurrency(r.wave_for({"region": "eu-north"})) == 2
    assert r.concurrency(r.wave_for({})) == 4


def test_no_default_wave_when_a_wave_selects_everything() -> None:
    cfg = FleetConfig.model_validate({"rollout": {"waves": [{"name": "a"}, {"name": "rest"}]}})
    assert [w.name for w in cfg.rollout.effective_waves] == ["a", "rest"]
    assert cfg.rollout.wave_for({"x": "y"}).name == "a"


def test_per_cluster_overrides() -> None:
    cfg = FleetConfig.model_validate(
        {
            "executor": "agent",
            "rollout": {"maintenanceWindows": [{"schedule": "@daily", "duration": "1h"}]},
            "clusters": {
                "entries": [
                    {
                        "name": "c1",
                        "namespace": "ns",
                        "executor": "autopilot",
                        "labels": {"ring": "0"},
                        "maintenanceWindows": [],
                        "paused": True,
                    }
                ]
            },
        }
    )
    c1 = cfg.for_cluster("ns", "c1", {"ring": "5", "team": "x"})
    assert c1.executor is Executor.AUTOPILOT
    assert c1.kubeconfig_secret == "c1-kubeconfig"
    assert c1.labels == {"ring": "0", "team": "x"}
    assert c1.maintenance_windows == ()
    assert c1.paused
    other = cfg.for_cluster("ns", "c2")
    assert other.executor is Executor.AGENT
    assert len(other.maintenance_windows) == 1
    assert not other.paused


def test_label_selector_string() -> None:
    sel = parse_label_selector("env=prod, tier!=db,zone in (a, b),!legacy,owner")
    assert sel.matches({"env": "prod", "zone": "a", "owner": "me"})
    assert not sel.matches({"env": "prod", "zone": "c", "owner": "me"})
    assert not sel.matches({"env": "prod", "zone": "a", "owner": "me", "legacy": ""})
    assert not sel.matches({"env": "prod", "zone": "a", "owner": "me", "tier": "db"})
    assert parse_label_selector("").matches({})




def test_agents_default_release_prefix_covers_the_default_url_template() -> None:
    url = DEFAULT_URL_TEMPLATE.format(version="v1.32.1+k0s.0", arch="amd64")
    assert url_under_prefix(url, DEFAULT_RELEASE_PREFIX)


def test_fault_detection_bounds(write: Write) -> None:
    """clusters.unreachableAfter and status.wedgedAfter: defaults, durations or seconds,
    and a clear error for a bound too short to mean anything."""
    cfg = load_config(None, env={})
    assert cfg.clusters.unreachable_after == timedelta(seconds=30)
    assert cfg.status.wedged_after == timedelta(seconds=180)
    cfg = load_config(write("""
        clusters: {unreachableAfter: 2m}
        status: {wedgedAfter: 600}
        """), env={})
    assert cfg.clusters.unreachable_after == timedelta(minutes=2)
    assert cfg.status.wedged_after == timedelta(minutes=10)
    cfg = load_config(None, env={"K0S_FLEET_CLUSTERS__UNREACHABLE_AFTER": "45s"})
    assert cfg.clusters.unreachable_after == timedelta(seconds=45)
    lines = problems(write("""
        clusters: {unreachableAfter: 2s}
        status: {wedgedAfter: 10s}
        """))
    assert lines[0].startswith("clusters.unreachableAfter: must be at least 5s (got 2s)"), lines
    assert lines[1].startswith("status.wedgedAfter: must be at least 30s (got 10s)"), lines
    lines = problems(write("""
        clusters: {unreachableAfter: soon}
        status: {wedgedAfter: -5}
        """))
    assert lines[0].startswith("clusters.unreachableAfter: "), lines
    assert "soon" in lines[0], lines
    assert lines[1].startswith("status.wedgedAfter: "), lines


def test_url_keys_need_their_scheme_and_a_host() -> None:
    """telemetry.otlpEndpoint (http or https) and extension.url (https only), one rule."""
    assert problems(None, {"K0S_FLEET_TELEMETRY__OTLP_ENDPOINT": "ftp://c:4318",
                           "K0S_FLEET_EXTENSION__URL": "http://ext:9443/hooks"}) == [
        "telemetry.otlpEndpoint: must be an http(s) URL (got 'ftp://c:4318') "
        "(from K0S_FLEET_TELEMETRY__OTLP_ENDPOINT)",
        "extension.url: must be an https URL (got 'http://ext:9443/hooks'): the hooks are "
        "served over TLS (from K0S_FLEET_EXTENSION__URL)",
    ]
    assert problems(None, {"K0S_FLEET_TELEMETRY__OTLP_ENDPOINT": "http://:4318"}) == [
        "telemetry.otlpEndpoint: must be an http(s) URL (got 'http://:4318') "
        "(from K0S_FLEET_TELEMETRY__OTLP_ENDPOINT)"]
    cfg = load_config(None, env={"K0S_FLEET_TELEMETRY__OTLP_ENDPOINT": "https://c",
                                 "K0S_FLEET_EXTENSION__URL": "https://ext:9443/hooks"})
    assert (cfg.telemetry.otlp_endpoint, cfg.extension.url) == ("https://c",
                                                               "https://ext:9443/hooks")
