"""Static review of the image build (no Docker engine here): what the charts run must be
what the Dockerfile builds, from a pinned base, as a non-root user, from a small context."""

from __future__ import annotations

import re
import tomllib

import yaml

from fleet.testing.binaries import REPO_ROOT
from tests.helpers.charts import AGENT_CHART, CONTROLLER_CHART, pod_spec, render

DOCKERFILE = (REPO_ROOT / "Dockerfile").read_text()
DOCKERIGNORE = (REPO_ROOT / ".dockerignore").read_text().splitlines()


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE)
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


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
