"""Rendering and installing the charts with the real helm."""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import yaml

from fleet.kube import KubeClient
from fleet.kube.resources import NAMESPACES, Resource
from fleet.testing.binaries import REPO_ROOT, binary
from fleet.testing.world import ApiServer

CHARTS = REPO_ROOT / "charts"


CONTROLLER_CHART = CHARTS / "k0s-fleet"


AGENT_CHART = CHARTS / "k0s-fleet-agent"


# Optional APIs the templates look for; a real cluster announces them through discovery.
OPTIONAL_APIS = (
    "cert-manager.io/v1",
    "runtime.cluster.x-k8s.io/v1beta2",
    "monitoring.coreos.com/v1",
    "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
)


WORKLOAD_KINDS = ("Deployment", "DaemonSet")


# -- helpers shared with the integration tests ----------------------------------------
@functools.cache
def helm_env() -> dict[str, str]:
    """An environment where helm keeps its config, cache and data in a private directory."""
    home = Path(tempfile.mkdtemp(prefix="k0s-fleet-helm-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_")}
    env.update(HELM_CONFIG_HOME=str(home / "config"), HELM_CACHE_HOME=str(home / "cache"),
               HELM_DATA_HOME=str(home / "data"), HELM_CONTENT_CACHE=str(home / "content"),
               KUBECONFIG=str(home / "no-kubeconfig"))
    return env


def helm(*args: str | Path, check: bool = True,
         timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(binary("helm")), *map(str, args)], env=helm_env(), capture_output=True,
        text=True, timeout=timeout, check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"helm {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr}"
        )
    return proc


@dataclass(frozen=True)
class Manifest:
    docs: list[dict[str, Any]]

    def kinds(self) -> list[str]:
        return sorted(d["kind"] for d in self.docs)

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [d for d in self.all(kind) if name is None or d["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
        return found[0]

    def workload(self) -> dict[str, Any]:
        (w,) = [d for d in self.docs if d["kind"] in WORKLOAD_KINDS]
        return w


# The controller chart reads Secrets cluster-wide only when told to (issue #29: no
# namespaces and no rbac.secrets.clusterWide fails the install, naming the value). A test
# that renders or installs it without saying where the Clusters live says this, as an
# operator would; the default itself is tested in tests/unit/test_chart_secret_rbac.py.
CLUSTER_WIDE_SECRETS = "rbac.secrets.clusterWide=true"
_SCOPE_KEYS = ("clusterWide", "namespaces")


def scoped(chart: Path | str, sets: Sequence[str] = (), *values_files: Path) -> list[str]:
    """``sets`` with :data:`CLUSTER_WIDE_SECRETS` first for the controller chart, unless
    the sets or values files already say where Secrets are read."""
    said = any(k in s for s in sets for k in _SCOPE_KEYS) or any(
        k in f.read_text() for f in values_files for k in _SCOPE_KEYS)
    if said or "k0s-fleet-agent" in str(chart) or "k0s-fleet" not in Path(chart).name:
        return list(sets)
    return [CLUSTER_WIDE_SECRETS, *sets]


def template_args(chart: Path, *values_files: Path, sets: Sequence[str] = (),
                  api_versions: Iterable[str] = OPTIONAL_APIS) -> list[str]:
    sets = scoped(chart, sets, *values_files)
    args = [str(chart)]
    for f in values_files:
        args += ["-f", str(f)]
    for s in sets:
        args += ["--set-json" if s.startswith("json:") else "--set", s.removeprefix("json:")]
    for api in api_versions:
        args += ["--api-versions", api]
    return args


@functools.lru_cache(maxsize=256)
def _template(args: tuple[str, ...], inputs: tuple[tuple[str, float], ...]) -> str:
    """helm template output, cached per process (``inputs``: values files and mtimes)."""
    return helm("template", *args).stdout


def render(chart: Path, *values_files: Path, sets: Sequence[str] = (),
           api_versions: Iterable[str] = OPTIONAL_APIS, release: str = "r1",
           namespace: str = "fleet-system") -> Manifest:
    args = (release, "--namespace", namespace,
            *template_args(chart, *values_files, sets=sets, api_versions=api_versions))
    inputs = tuple((str(f), f.stat().st_mtime) for f in values_files)
    return Manifest([d for d in yaml.safe_load_all(_template(args, inputs)) if d])


def rbac_grants(rules: Iterable[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    """(apiGroup, resource, verb, resourceName or '*') for every combination a rule allows."""
    out: set[tuple[str, str, str, str]] = set()
    for r in rules:
        for g in r.get("apiGroups", []):
            for res in r.get("resources", []):
                for v in r.get("verbs", []):
                    for n in r.get("resourceNames") or ["*"]:
                        out.add((g, res, v, n))
    return out


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]  # type: ignore[no-any-return]



DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment", namespaced=True)


DAEMONSETS = Resource("apps", "v1", "daemonsets", "DaemonSet", namespaced=True)


RBAC = "rbac.authorization.k8s.io"


CLUSTER_ROLES = Resource(RBAC, "v1", "clusterroles", "ClusterRole", namespaced=False)


CLUSTER_ROLE_BINDINGS = Resource(RBAC, "v1", "clusterrolebindings", "ClusterRoleBinding",
                                 namespaced=False)


ROLES = Resource(RBAC, "v1", "roles", "Role", namespaced=True)


ROLE_BINDINGS = Resource(RBAC, "v1", "rolebindings", "RoleBinding", namespaced=True)


FLOWCONTROL = "flowcontrol.apiserver.k8s.io"


FLOW_SCHEMAS = Resource(FLOWCONTROL, "v1", "flowschemas", "FlowSchema", namespaced=False)


PRIORITY_LEVELS = Resource(FLOWCONTROL, "v1", "prioritylevelconfigurations",
                           "PriorityLevelConfiguration", namespaced=False)


# -- helpers shared with test_rbac_*.py --------------------------------------------------
def kubeconfig_file(server: ApiServer, directory: Path) -> Path:
    return server.write_kubeconfig(directory / f"{server.name}-admin.kubeconfig")


async def helm_cli(*args: str | Path, check: bool = True) -> str:
    """helm in a worker thread, so the event loop (and other clients) keep running."""
    proc = await anyio.to_thread.run_sync(lambda: helm(*args, check=check))
    return proc.stdout + proc.stderr


async def create_namespace(client: KubeClient, name: str, *,
                           pod_security: str | None = None) -> None:
    labels = {"pod-security.kubernetes.io/enforce": pod_security} if pod_security else {}
    await client.create(NAMESPACES, {"metadata": {"name": name, "labels": labels}})
