"""tests/image/pod.py: the charts' pod specs as ``podman run`` options (pure, no podman)."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.charts import AGENT_CHART, CONTROLLER_CHART, pod_spec, render
from tests.image.pod import (
    SERVICE_ACCOUNT_DIR,
    PodRun,
    PodTranslationError,
    container_args,
    memory_bytes,
    podman_run_args,
)


def controller() -> dict[str, Any]:
    return copy.deepcopy(pod_spec(render(CONTROLLER_CHART).workload()))


def agent() -> dict[str, Any]:
    return copy.deepcopy(pod_spec(render(AGENT_CHART).workload()))


CTL_RUN = PodRun(fields={"metadata.name": "p", "metadata.namespace": "ns"},
                 volumes={"config": Path("/cm")}, service_account=Path("/sa"),
                 api_server=("127.0.0.1", 6443), network="host")
AGENT_RUN = PodRun(fields={"spec.nodeName": "n1"},
                   volumes={"k0s-bin": Path("/h/bin"), "k0s-run": Path("/h/run"),
                            "state": Path("/h/state")})


def pairs(args: list[str]) -> list[tuple[str, str]]:
    return list(itertools.pairwise(args))


def test_controller_pod_as_podman_options() -> None:
    args = podman_run_args(controller(), CTL_RUN)
    assert args[0] == "--network=host"
    assert ("--user", "65532:65532") in pairs(args)
    assert ("--group-add", "65532") in pairs(args)  # fsGroup
    assert {"--read-only", "--read-only-tmpfs=false", "--cap-drop=all"} <= set(args)
    assert ("--security-opt", "no-new-privileges") in pairs(args)
    assert "--pid=host" not in args and "--privileged" not in args
    assert f"--memory={512 * 2**20}" in args
    assert ("--tmpfs", f"/tmp:rw,exec,mode=1777,size={64 * 2**20}") in pairs(args)
    assert ("--mount", "type=bind,source=/cm/fleet.yaml,target=/etc/k0s-fleet/fleet.yaml,ro"
            ) in pairs(args)
    assert ("--mount", f"type=bind,source=/sa,target={SERVICE_ACCOUNT_DIR},ro") in pairs(args)
    env = [b for a, b in pairs(args) if a == "--env"]
    assert {"POD_NAME=p", "POD_NAMESPACE=ns", "K0S_FLEET_MANAGEMENT__NAMESPACE=ns",
            "KUBERNETES_SERVICE_HOST=127.0.0.1", "KUBERNETES_SERVICE_PORT=6443"} <= set(env)
    assert container_args(controller())[0] == "controller"


def test_agent_pod_as_podman_options() -> None:
    args = podman_run_args(agent(), AGENT_RUN)
    assert args[0] == "--network=none"
    assert "--pid=host" in args
    assert ("--user", "0:0") in pairs(args)
    assert ("--security-opt", "apparmor=unconfined") in pairs(args)
    assert {"--read-only", "--cap-drop=all"} <= set(args)
    mounts = [b for a, b in pairs(args) if a == "--mount"]
    assert "type=bind,source=/h/bin,target=/host/usr/local/bin" in mounts  # read-write
    assert "type=bind,source=/h/run,target=/host/run/k0s,ro" in mounts
    assert "K0S_FLEET_AGENT_NODE_NAME=n1" in [b for a, b in pairs(args) if a == "--env"]


@pytest.mark.parametrize(("change", "message"), [
    (lambda p: p["containers"][0]["securityContext"].update(procMount="Unmasked"),
     "container securityContext: no translation for procMount"),
    (lambda p: p["securityContext"].update(sysctls=[]),
     "pod securityContext: no translation for sysctls"),
    (lambda p: p.update(hostNetwork=True), "pod spec: no translation for hostNetwork"),
    (lambda p: p["containers"][0].update(command=["sh"]), "overrides the image's ENTRYPOINT"),
    (lambda p: p["securityContext"].update(runAsUser=0), "runAsNonRoot without a non-zero"),
    (lambda p: p["volumes"].append({"name": "x", "nfs": {}}) or
     p["containers"][0]["volumeMounts"].append({"name": "x", "mountPath": "/x"}),
     "volume x: kind nfs not translated"),
    (lambda p: p["securityContext"].update(seccompProfile={"type": "Unconfined"}),
     "seccompProfile Unconfined not translated"),
])
def test_what_is_not_translated_is_refused_by_name(change: Any, message: str) -> None:
    pod = controller()
    change(pod)
    with pytest.raises(PodTranslationError, match=message):
        podman_run_args(pod, CTL_RUN)


def test_missing_inputs_are_named() -> None:
    with pytest.raises(PodTranslationError, match=r"no value given for metadata\.name"):
        podman_run_args(controller(), PodRun(volumes={"config": Path("/cm")}))
    with pytest.raises(PodTranslationError, match=r"volume config \(configMap\): no directory"):
        podman_run_args(controller(), PodRun(fields=CTL_RUN.fields))


def test_memory_quantities() -> None:
    assert memory_bytes("64Mi") == 64 * 2**20
    assert memory_bytes("1G") == 10**9
    assert memory_bytes("1024") == 1024
    with pytest.raises(PodTranslationError, match=r"'1\.5Gi'"):
        memory_bytes("1.5Gi")
