"""``make dist`` and what it builds, installed the way docs/operations.md says.

- The CLI's wheel goes into a clean virtual environment (``python -m venv``, ``pip
  install`` of the wheel: its dependencies from the package index pip is configured
  with) and runs from there, not from the checkout; it carries the ``fleet`` package
  without the test world (``fleet.testing``) or anything of ``tests/``.
- The charts' packages: the controller's ``.tgz`` installed with the real helm into the
  management API server, then upgraded as "Upgrading k0s-fleet" says (the next chart's
  CRDs applied server-side first, then ``helm upgrade``); the agent's installed into a
  workload API server and uninstalled.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet import __version__
from fleet.kube import KubeClient
from fleet.testing.binaries import REPO_ROOT
from fleet.testing.world import World
from tests.helpers.charts import (
    AGENT_CHART,
    CONTROLLER_CHART,
    DAEMONSETS,
    DEPLOYMENTS,
    create_namespace,
    helm,
    helm_cli,
    kubeconfig_file,
    scoped,
)
from tests.helpers.names import unique

CRDS_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``make dist`` into a directory of its own (``-o venv -o testenv``: the shared
    .venv and the binaries are already there; remaking the venv here would reinstall
    it under the other tests' feet)."""
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(["make", "-s", "-o", "venv", "-o", "testenv", "dist", f"DIST={out}",
                           f"BIN={Path(sys.executable).parent}"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = {p.name: p for p in out.iterdir()}
    assert sorted(found) == sorted([
        f"k0s_fleet-{__version__}-py3-none-any.whl", f"k0s-fleet-{__version__}.tgz",
        f"k0s-fleet-agent-{__version__}.tgz"]), sorted(found)
    assert not (REPO_ROOT / "build" / "lib").exists()  # no build litter in the checkout
    return {"wheel": found[f"k0s_fleet-{__version__}-py3-none-any.whl"],
            "controller": found[f"k0s-fleet-{__version__}.tgz"],
            "agent": found[f"k0s-fleet-agent-{__version__}.tgz"]}


# -- the wheel -------------------------------------------------------------------------
def test_the_wheel_holds_the_package_and_nothing_of_the_tests(dist: dict[str, Path]) -> None:
    with zipfile.ZipFile(dist["wheel"]) as whl:
        names = whl.namelist()
        meta = whl.read(f"k0s_fleet-{__version__}.dist-info/METADATA").decode()
        entry_points = whl.read(f"k0s_fleet-{__version__}.dist-info/entry_points.txt").decode()
    top = {n.split("/", 1)[0] for n in names}
    assert top == {"fleet", f"k0s_fleet-{__version__}.dist-info"}, top
    assert not [n for n in names if n.startswith(("fleet/testing/", "tests/"))]
    assert "fleet/py.typed" in names
    for module in ("fleet/cli/__init__.py", "fleet/cli/controller.py", "fleet/cli/agent.py",
                   "fleet/status/runtime.py", "fleet/kube/client.py"):
        assert module in names, module
    # the source files of the package, no more: nothing but .py and py.typed
    assert {Path(n).suffix for n in names if n.startswith("fleet/")} == {".py", ".typed"}
    assert "k0s-fleet = fleet.cli:main" in entry_points
    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    required = [line.split(": ", 1)[1] for line in meta.splitlines()
                if line.startswith("Requires-Dist: ") and "extra ==" not in line]
    assert len(required) == len(declared["dependencies"])


@pytest.fixture(scope="module")
def installed_cli(dist: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean venv with the wheel installed (docs: ``pipx install dist/*.whl`` does the
    same in a venv of its own); the path of its ``k0s-fleet``."""
    venv = tmp_path_factory.mktemp("cli") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    proc = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(dist["wheel"])],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return venv / "bin" / "k0s-fleet"


def cli(exe: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, check=False, env={"PATH": "/usr/bin:/bin",
                                                       "HOME": str(cwd)})


def test_the_installed_cli_runs_from_its_venv(installed_cli: Path, tmp_path: Path) -> None:
    version = cli(installed_cli, "--version", cwd=tmp_path)
    assert (version.returncode, version.stdout.strip()) == (0, f"k0s-fleet {__version__}")
    helped = cli(installed_cli, "--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    for command in ("controller", "agent", "upgrade", "plan", "status", "demo"):
        assert command in helped.stdout
    for command in ("upgrade", "plan", "status", "controller", "agent"):
        sub = cli(installed_cli, command, "--help", cwd=tmp_path)
        assert sub.returncode == 0, f"{command} --help: {sub.stderr}"
    # the package imported is the installed one, not the checkout's
    python = installed_cli.parent / "python"
    where = subprocess.run([str(python), "-c", "import fleet; print(fleet.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True)
    assert where.stdout.startswith(str(installed_cli.parent.parent)), where.stdout
    # the demo needs the test world of a checkout: said so, no traceback
    demo = cli(installed_cli, "demo", cwd=tmp_path)
    assert demo.returncode == 2
    assert "runs from a checkout of the repository" in demo.stderr
    assert "Traceback" not in demo.stderr
    # and a command without a cluster fails as documented (no kubeconfig anywhere)
    status = cli(installed_cli, "status", cwd=tmp_path)
    assert status.returncode != 0 and "Traceback" not in status.stderr, status.stderr


# -- the charts' packages ----------------------------------------------------------------
def chart_files(tgz: Path) -> dict[str, bytes]:
    with tarfile.open(tgz) as tar:
        out = {}
        for m in tar.getmembers():
            f = tar.extractfile(m) if m.isfile() else None
            if f is not None:
                out[m.name.split("/", 1)[1]] = f.read()
        return out


@pytest.mark.parametrize("which", ["controller", "agent"])
def test_the_packages_hold_the_charts_as_they_are(dist: dict[str, Path], which: str) -> None:
    chart = CONTROLLER_CHART if which == "controller" else AGENT_CHART
    packaged = chart_files(dist[which])
    # ci/ (helm's chart-testing values) is left out by the chart's .helmignore
    assert "ci/" in (chart / ".helmignore").read_text().split()
    source = {str(p.relative_to(chart)): p.read_bytes() for p in chart.rglob("*")
              if p.is_file() and p.relative_to(chart).parts[0] != "ci"}
    assert set(packaged) == set(source)
    for name, body in source.items():
        if name != "Chart.yaml":  # helm rewrites it (same content, its own layout)
            assert packaged[name] == body, name
    meta = yaml.safe_load(packaged["Chart.yaml"])
    assert (meta["version"], meta["appVersion"]) == (__version__, __version__)
    sets = [a for s in scoped(dist[which]) for a in ("--set", s)]
    assert helm("lint", dist[which], *sets).returncode == 0


@pytest.fixture
async def mgmt_kubeconfig(crds_installed: World, tmp_path: Path) -> Path:
    return kubeconfig_file(crds_installed["mgmt"], tmp_path)


@pytest.fixture
async def wl1_kubeconfig(crds_installed: World, tmp_path: Path) -> Path:
    return kubeconfig_file(crds_installed["wl1"], tmp_path)


async def apply_crds_server_side(client: KubeClient, crds: dict[str, bytes]) -> list[str]:
    """What ``kubectl apply --server-side --force-conflicts -f <chart>/crds/`` sends."""
    names = []
    for body in crds.values():
        crd = yaml.safe_load(body)
        name = crd["metadata"]["name"]
        await client.request("PATCH", f"{CRDS_PATH}/{name}", body=crd,
                             query={"fieldManager": "kubectl", "force": "true"},
                             content_type="application/apply-patch+yaml")
        names.append(name)
    return names


@pytest.fixture
async def restore_crds(mgmt: KubeClient) -> AsyncIterator[None]:
    """The upgrade test changes the shared world's CRDs: put the chart's back after."""
    yield
    await apply_crds_server_side(mgmt, {
        p.name: p.read_bytes() for p in (CONTROLLER_CHART / "crds").glob("*.yaml")})


@pytest.mark.anyio
@pytest.mark.usefixtures("restore_crds")
async def test_the_controller_package_installs_and_upgrades(
        dist: dict[str, Path], mgmt: KubeClient, mgmt_kubeconfig: Path,
        tmp_path: Path) -> None:
    ns, release = unique("kf-dist"), unique("k0s-fleet")
    capi_ns = unique("capi")
    await create_namespace(mgmt, capi_ns)
    values = tmp_path / "fleet-values.yaml"
    values.write_text(yaml.safe_dump({"fleet": {"clusters": {"namespaces": [capi_ns]}}}))
    # docs/operations.md "Install the controller", from the package
    out = await helm_cli("install", release, dist["controller"], "--namespace", ns,
                         "--create-namespace", "--values", values,
                         "--kubeconfig", mgmt_kubeconfig)
    assert "STATUS: deployed" in out
    try:
        deploy = await mgmt.get(DEPLOYMENTS, release, ns)
        image = deploy["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image.endswith(f":{__version__}")

        # "Upgrading k0s-fleet": the next release's chart (here: this one as 0.1.1-next,
        # with a CRD that changed), its CRDs applied server-side first, then helm upgrade
        next_dir = tmp_path / "next"
        next_dir.mkdir()
        with tarfile.open(dist["controller"]) as tar:
            tar.extractall(next_dir, filter="data")
        crd_file = next_dir / "k0s-fleet" / "crds" / "fleet.k0s-fleet.io_nodeplans.yaml"
        crd: dict[str, Any] = yaml.safe_load(crd_file.read_text())
        marker = f"upgraded by {release}"
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] = marker
        crd_file.write_text(yaml.safe_dump(crd))
        helm("package", next_dir / "k0s-fleet", "--version", "0.1.1-next",
             "--app-version", "0.1.1-next", "-d", tmp_path)
        next_tgz = tmp_path / "k0s-fleet-0.1.1-next.tgz"
        applied = await apply_crds_server_side(mgmt, {
            k: v for k, v in chart_files(next_tgz).items() if k.startswith("crds/")})
        assert sorted(applied) == ["fleetupgrades.fleet.k0s-fleet.io",
                                   "nodeplans.fleet.k0s-fleet.io"]
        stored = await mgmt.request("GET", f"{CRDS_PATH}/nodeplans.fleet.k0s-fleet.io")
        assert stored["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
            "description"] == marker
        out = await helm_cli("upgrade", release, next_tgz, "--namespace", ns,
                             "--values", values, "--kubeconfig", mgmt_kubeconfig)
        assert "has been upgraded" in out
        deploy = await mgmt.get(DEPLOYMENTS, release, ns)
        image = deploy["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image.endswith(":0.1.1-next")
        assert deploy["metadata"]["labels"]["helm.sh/chart"] == "k0s-fleet-0.1.1-next"
        history = await helm_cli("history", release, "--namespace", ns,
                                 "--kubeconfig", mgmt_kubeconfig)
        assert len(history.strip().splitlines()) == 3  # header + 2 revisions
    finally:
        await helm_cli("uninstall", release, "--namespace", ns,
                       "--kubeconfig", mgmt_kubeconfig)


@pytest.mark.anyio
async def test_the_agent_package_installs(dist: dict[str, Path], wl1: KubeClient,
                                          wl1_kubeconfig: Path) -> None:
    ns, release = unique("kfa-dist"), unique("k0s-fleet-agent")
    await create_namespace(wl1, ns, pod_security="privileged")
    out = await helm_cli("install", release, dist["agent"], "--namespace", ns,
                         "--kubeconfig", wl1_kubeconfig)
    try:
        assert "STATUS: deployed" in out
        ds = await wl1.get(DAEMONSETS, release, ns)
        image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image.endswith(f":{__version__}")
    finally:
        # its signal policy binds cluster-wide: never leave it to later modules' agents
        await helm_cli("uninstall", release, "--namespace", ns, "--kubeconfig", wl1_kubeconfig)
