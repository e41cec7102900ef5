"""Static review of the image build (no Docker engine here): what the charts run must be
what the Dockerfile builds, from a pinned base, as a non-root user, from a small context."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tomllib

import yaml

import fleet
from fleet.testing.binaries import REPO_ROOT
from tests.helpers.charts import AGENT_CHART, CONTROLLER_CHART, pod_spec, render
from tests.helpers.dockerfile import instructions

DOCKERIGNORE = (REPO_ROOT / ".dockerignore").read_text().splitlines()




def test_base_image_is_pinned_and_shared_by_both_stages() -> None:
    args = dict(rest.split("=", 1) for op, rest in instructions() if op == "ARG" and "=" in rest)
    base = args["PYTHON_IMAGE"]
    name, _, tag = base.partition(":")
    assert name == "python"
    # a full version (3.11.N), a slim variant and a Debian release: never "latest"/"3"
    assert re.fullmatch(r"3\.11\.\d+-slim-(bookworm|trixie)(@sha256:[0-9a-f]{64})?", tag), tag
    froms = [rest for op, rest in instructions() if op == "FROM"]
    assert len(froms) == 2
    assert froms[0] == "${PYTHON_IMAGE} AS build" and froms[1] == "${PYTHON_IMAGE}"


def test_final_stage_is_non_root_and_runs_k0s_fleet() -> None:
    final = instructions()[[i for i, (op, _) in enumerate(instructions()) if op == "FROM"][-1]:]
    users = [rest for op, rest in final if op == "USER"]
    assert users == ["65532:65532"]
    assert ("ENTRYPOINT", '["k0s-fleet"]') in final
    copies = [rest for op, rest in final if op == "COPY"]
    assert copies == ["--from=build /opt/k0s-fleet /opt/k0s-fleet"]  # only the virtualenv
    env = " ".join(rest for op, rest in final if op == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env  # the root filesystem is read-only


def test_charts_run_the_image_s_entrypoint_and_user() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["k0s-fleet"] == "fleet.cli:main"
    ctl = pod_spec(render(CONTROLLER_CHART).workload())
    assert "command" not in ctl["containers"][0]  # the image's ENTRYPOINT
    assert ctl["containers"][0]["args"][0] == "controller"
    assert ctl["securityContext"]["runAsUser"] == 65532
    agent = pod_spec(render(AGENT_CHART).workload())
    assert "command" not in agent["containers"][0]
    assert agent["containers"][0]["args"][0] == "agent"
    for chart in (CONTROLLER_CHART, AGENT_CHART):
        values = yaml.safe_load((chart / "values.yaml").read_text())
        assert values["image"]["repository"] == "ghcr.io/k0s-fleet/k0s-fleet"


def test_build_context_is_an_allow_list_covering_every_copy() -> None:
    rules = [r for r in DOCKERIGNORE if r and not r.startswith("#")]
    assert rules[0] == "*"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "fleet"}
    sources = []
    for op, rest in instructions():
        if op == "COPY" and not rest.startswith("--from"):
            sources += rest.split()[:-1]
    assert sources and all(src.rstrip("/") in allowed for src in sources), sources


def test_image_reference_labels_and_docs_agree() -> None:
    """One image reference: the charts' default repository with the project's version as
    tag is what the Dockerfile labels say, what docs/operations.md tells to build and push,
    and what `make image` (hack/image/lib.sh) tags and names its archive."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    version = project["version"]
    repos = set()
    for chart in (CONTROLLER_CHART, AGENT_CHART):
        repos.add(yaml.safe_load((chart / "values.yaml").read_text())["image"]["repository"])
        meta = yaml.safe_load((chart / "Chart.yaml").read_text())
        assert meta["appVersion"] == version, chart  # the default tag
        assert meta["annotations"]["artifacthub.io/license"] == project["license"]
    (repo,) = repos
    assert repo.startswith("ghcr.io/")
    args = dict(rest.split("=", 1) for op, rest in instructions() if op == "ARG" and "=" in rest)
    assert args["VERSION"] == version == fleet.__version__
    labels = dict(kv.split("=", 1) for op, rest in instructions() if op == "LABEL"
                  for kv in shlex.split(rest))
    assert labels == {
        "org.opencontainers.image.title": project["name"],
        "org.opencontainers.image.description": project["description"],
        "org.opencontainers.image.version": "${VERSION}",
        # ghcr.io links a package to the repository its source label names
        "org.opencontainers.image.source": f"https://github.com/{repo.removeprefix('ghcr.io/')}",
        "org.opencontainers.image.licenses": project["license"],
    }
    ops = (REPO_ROOT / "docs" / "operations.md").read_text()
    section = ops[ops.index("## Build the image"):]
    archive = f"build/image/k0s-fleet-{version}.oci.tar"
    assert f"{repo}:{version}" in section and f"oci-archive:{archive}" in section
    assert f"image.repository: {repo}" in section
    assert f"--build-arg PYTHON_IMAGE={args['PYTHON_IMAGE']}@sha256:" in section
    env = {k: v for k, v in os.environ.items() if not k.startswith("K0S_FLEET_IMAGE")}
    out = subprocess.run(["bash", "-c", "source hack/image/lib.sh; image_ref; image_archive"],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [f"{repo}:{version}", str(REPO_ROOT / archive)]
