"""The CLI finds the management cluster's kubeconfig as kubectl does (fleet/cli/common.py):
--kubeconfig / management.kubeconfig, then $KUBECONFIG merged, then in-cluster, then
~/.kube/config; --context on its own."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet.cli import common
from fleet.config.loader import load_config
from fleet.config.models import ManagementSettings


def kubeconfig(name: str, server: str, *, current: str | None = None,
               user: dict[str, Any] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server}}],
        "users": [{"name": name, "user": user or {"token": f"token-{name}"}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
    }
    if current:
        doc["current-context"] = current
    return doc


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def server_of(doc: dict[str, Any], context: str | None = None) -> str:
    ctx_name = context or doc["current-context"]
    ctx = next(c["context"] for c in doc["contexts"] if c["name"] == ctx_name)
    return str(next(c["cluster"]["server"] for c in doc["clusters"]
                    if c["name"] == ctx["cluster"]))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    return h


def test_merge_first_file_wins_per_name_and_current_context() -> None:
    a = kubeconfig("a", "https://a")
    b = {**kubeconfig("b", "https://b", current="b"),
         "clusters": [{"name": "a", "cluster": {"server": "https://shadowed"}},
                      {"name": "b", "cluster": {"server": "https://b"}}]}
    c = kubeconfig("c", "https://c", current="c")
    merged = common.merge_kubeconfigs([a, b, c])
    assert merged["current-context"] == "b"  # the first file that sets one
    assert {c["name"]: c["cluster"]["server"] for c in merged["clusters"]} == {
        "a": "https://a", "b": "https://b", "c": "https://c"}
    assert [c["name"] for c in merged["contexts"]] == ["a", "b", "c"]
    assert [u["name"] for u in merged["users"]] == ["a", "b", "c"]
    assert server_of(merged) == "https://b"


def test_kubeconfig_env_list_skips_missing_files_and_resolves_paths_per_file(
        tmp_path: Path) -> None:
    one = write(tmp_path / "one" / "config", kubeconfig(
        "one", "https://one", current="one",
        user={"client-certificate": "certs/me.crt", "client-key": "/abs/me.key"}))
    two = write(tmp_path / "two" / "config", {
        **kubeconfig("two", "https://two"),
        "clusters": [{"name": "two", "cluster": {"server": "https://two",
                                                 "certificate-authority": "ca.crt"}}]})
    value = os.pathsep.join([str(tmp_path / "missing"), str(one), "", str(two)])
    merged = common.kubeconfig_from_env(value)
    assert merged is not None
    assert merged["current-context"] == "one"
    users = {u["name"]: u["user"] for u in merged["users"]}
    assert users["one"]["client-certificate"] == str(tmp_path / "one" / "certs" / "me.crt")
    assert users["one"]["client-key"] == "/abs/me.key"
    clusters = {c["name"]: c["cluster"] for c in merged["clusters"]}
    assert clusters["two"]["certificate-authority"] == str(tmp_path / "two" / "ca.crt")
    assert common.kubeconfig_from_env(str(tmp_path / "nothing-here")) is None


def test_precedence(tmp_path: Path, home: Path) -> None:
    flag = write(tmp_path / "flag.yaml", kubeconfig("flag", "https://flag", current="flag"))
    env = write(tmp_path / "env.yaml", kubeconfig("env", "https://env", current="env"))
    write(home / ".kube" / "config", kubeconfig("home", "https://home", current="home"))
    in_pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}

    def found(m: ManagementSettings, environ: dict[str, str]) -> str | None:
        result = common.find_kubeconfig(m, environ)
        return None if result is None else server_of(result[0], m.context)

    # 1. --kubeconfig / management.kubeconfig beats everything
    assert found(ManagementSettings(kubeconfig=str(flag)),
                 {"KUBECONFIG": str(env), **in_pod}) == "https://flag"
    # 2. $KUBECONFIG beats in-cluster and ~/.kube/config
    assert found(ManagementSettings(), {"KUBECONFIG": str(env), **in_pod}) == "https://env"
    # 3. in-cluster beats ~/.kube/config
    assert found(ManagementSettings(), in_pod) is None
    # 4. ~/.kube/config last
    assert found(ManagementSettings(), {}) == "https://home"
    # --context on its own: the in-cluster account has no contexts, so ~/.kube/config
    assert found(ManagementSettings(context="home"), in_pod) == "https://home"
    # $KUBECONFIG naming only missing files counts as unset
    assert found(ManagementSettings(), {"KUBECONFIG": str(tmp_path / "gone")}) == \
        "https://home"


def test_no_kubeconfig_at_all_is_bad_input(home: Path) -> None:
    with pytest.raises(common.BadInputError, match="no management kubeconfig"):
        common.find_kubeconfig(ManagementSettings(), {})


@pytest.mark.parametrize("content", ["{not: [yaml", "- a list\n"])
def test_unusable_kubeconfig_is_bad_input(tmp_path: Path, content: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(content)
    with pytest.raises(common.BadInputError, match=str(bad)):
        common.find_kubeconfig(ManagementSettings(kubeconfig=str(bad)), {})
    with pytest.raises(common.BadInputError, match="cannot read"):
        common.find_kubeconfig(ManagementSettings(kubeconfig=str(tmp_path / "nope")), {})


@pytest.mark.anyio
async def test_management_client_from_merged_env_with_context(tmp_path: Path,
                                                               home: Path) -> None:
    """The merged document goes through the client layer (KubeClient.from_kubeconfig);
    an unknown --context is bad input naming it."""
    one = write(tmp_path / "one.yaml", kubeconfig("one", "https://127.0.0.1:1", current="one"))
    two = write(tmp_path / "two.yaml", kubeconfig("two", "https://127.0.0.1:2"))
    environ = {"KUBECONFIG": os.pathsep.join([str(one), str(two)])}
    client = await common.management_client(
        load_config(None, overrides={"management": {"context": "two"}}),
        environ=environ)
    await client.close()
    with pytest.raises(common.BadInputError, match="three"):
        await common.management_client(
            load_config(None, overrides={"management": {"context": "three"}}),
            environ=environ)
