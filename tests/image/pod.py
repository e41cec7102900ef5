"""A rendered chart's Pod spec as ``podman run`` arguments: the container as the kubelet
would start it (args, environment, user, capabilities, read-only root filesystem, seccomp,
AppArmor, no-new-privileges, host PID, memory limit, volumes).

Pure: the caller supplies what a kubelet would (the values of fieldRefs, a directory per
ConfigMap/Secret/hostPath volume, the service-account token directory). A field of the pod
spec this module does not translate is an error naming it, never silently dropped, so a
chart change that the image run does not honour fails here first.

Two differences from a kubelet, both the caller's choice and said where used: the network
namespace (``network``) and the API server address (``api_server``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

# Pod fields about where/when a pod runs (and the API server's defaults of such), not how
# its container runs.
SCHEDULING_FIELDS = frozenset({
    "affinity", "nodeSelector", "tolerations", "priorityClassName", "imagePullSecrets",
    "topologySpreadConstraints", "serviceAccountName", "serviceAccount",
    "terminationGracePeriodSeconds", "enableServiceLinks", "restartPolicy", "dnsPolicy",
    "schedulerName",
})
# Container fields the kubelet acts on outside the container's own start.
CONTAINER_PASSIVE_FIELDS = frozenset({
    "name", "image", "imagePullPolicy", "ports", "livenessProbe", "readinessProbe",
    "startupProbe", "terminationMessagePath", "terminationMessagePolicy",
})
_QUANTITY = re.compile(r"^(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_FACTORS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
            "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


class PodTranslationError(ValueError):
    """The pod spec asks for something this translation does not reproduce."""


@dataclass(frozen=True)
class PodRun:
    """What the kubelet would supply, and the two deliberate differences."""

    fields: Mapping[str, str] = field(default_factory=dict)  # fieldPath -> value
    volumes: Mapping[str, Path] = field(default_factory=dict)  # volume name -> host dir
    service_account: Path | None = None  # dir with token, ca.crt, namespace
    api_server: tuple[str, int] | None = None  # KUBERNETES_SERVICE_HOST/PORT
    network: str = "none"


def memory_bytes(quantity: str) -> int:
    m = _QUANTITY.match(quantity)
    if not m:
        raise PodTranslationError(f"memory quantity {quantity!r} not understood")
    return int(m.group(1)) * _FACTORS[m.group(2)]


def _unknown(what: str, obj: Mapping[str, Any], known: frozenset[str]) -> None:
    extra = sorted(set(obj) - known)
    if extra:
        raise PodTranslationError(f"{what}: no translation for {', '.join(extra)}")


def _security(pod: Mapping[str, Any], ctr: Mapping[str, Any]) -> list[str]:
    psc = pod.get("securityContext") or {}
    csc = ctr.get("securityContext") or {}
    _unknown("pod securityContext", psc, frozenset({
        "runAsNonRoot", "runAsUser", "runAsGroup", "fsGroup", "seccompProfile",
        "appArmorProfile"}))
    _unknown("container securityContext", csc, frozenset({
        "runAsNonRoot", "runAsUser", "runAsGroup", "allowPrivilegeEscalation",
        "readOnlyRootFilesystem", "privileged", "capabilities", "seccompProfile",
        "appArmorProfile"}))
    merged = {**psc, **csc}
    args: list[str] = []
    if "runAsUser" in merged:
        user = str(merged["runAsUser"])
        if "runAsGroup" in merged:
            user += f":{merged['runAsGroup']}"
        args += ["--user", user]
    if merged.get("runAsNonRoot") and merged.get("runAsUser") in (None, 0):
        # The kubelet refuses such a pod; an image USER alone would need the image here.
        raise PodTranslationError("runAsNonRoot without a non-zero runAsUser")
    if "fsGroup" in psc:
        args += ["--group-add", str(psc["fsGroup"])]
    for sc in (psc, csc):
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if seccomp not in (None, "RuntimeDefault"):  # RuntimeDefault: podman's default
            raise PodTranslationError(f"seccompProfile {seccomp} not translated")
        apparmor = (sc.get("appArmorProfile") or {}).get("type")
        if apparmor == "Unconfined":
            args += ["--security-opt", "apparmor=unconfined"]
        elif apparmor not in (None, "RuntimeDefault"):
            raise PodTranslationError(f"appArmorProfile {apparmor} not translated")
    if csc.get("privileged"):
        args.append("--privileged")
    if csc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    if csc.get("readOnlyRootFilesystem"):
        # Only what the pod mounts is writable (podman would add its own tmpfs otherwise).
        args += ["--read-only", "--read-only-tmpfs=false"]
    caps = csc.get("capabilities") or {}
    _unknown("capabilities", caps, frozenset({"drop", "add"}))
    args += [f"--cap-drop={c.lower()}" for c in caps.get("drop", [])]
    args += [f"--cap-add={c.lower()}" for c in caps.get("add", [])]
    return args


def _env(ctr: Mapping[str, Any], run: PodRun) -> list[str]:
    args: list[str] = []
    for e in ctr.get("env", []):
        if "value" in e:
            value = str(e["value"])
        else:
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            if path not in run.fields:
                raise PodTranslationError(f"env {e['name']}: no value given for {path}")
            value = run.fields[path]
        args += ["--env", f"{e['name']}={value}"]
    if run.api_server:
        host, port = run.api_server
        args += ["--env", f"KUBERNETES_SERVICE_HOST={host}",
                 "--env", f"KUBERNETES_SERVICE_PORT={port}"]
    return args


def _volumes(pod: Mapping[str, Any], ctr: Mapping[str, Any], run: PodRun) -> list[str]:
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    args: list[str] = []
    for m in ctr.get("volumeMounts", []):
        _unknown(f"volumeMount {m['name']}", m, frozenset({
            "name", "mountPath", "subPath", "readOnly"}))
        vol = volumes[m["name"]]
        kind = next(k for k in vol if k != "name")
        if kind == "emptyDir":
            if m.get("subPath"):
                raise PodTranslationError(f"volume {m['name']}: subPath of an emptyDir")
            opts = "rw,exec,mode=1777"  # a kubelet's emptyDir is not noexec
            if "sizeLimit" in vol[kind]:
                opts += f",size={memory_bytes(vol[kind]['sizeLimit'])}"
            args += ["--tmpfs", f"{m['mountPath']}:{opts}"]
        elif kind in ("configMap", "secret", "hostPath"):
            if m["name"] not in run.volumes:
                raise PodTranslationError(f"volume {m['name']} ({kind}): no directory given")
            src = run.volumes[m["name"]] / m.get("subPath", "")
            ro = ",ro" if m.get("readOnly") or kind != "hostPath" else ""
            args += ["--mount", f"type=bind,source={src},target={m['mountPath']}{ro}"]
        else:
            raise PodTranslationError(f"volume {m['name']}: kind {kind} not translated")
    if pod.get("automountServiceAccountToken", True) and run.service_account:
        args += ["--mount", f"type=bind,source={run.service_account},"
                 f"target={SERVICE_ACCOUNT_DIR},ro"]
    return args


def podman_run_args(pod: Mapping[str, Any], run: PodRun, *,
                    container: str | None = None) -> list[str]:
    """``podman run`` options for ``container`` (default: the only one) of ``pod``; the
    image and the container's args follow (see :func:`container_args`)."""
    _unknown("pod spec", pod, SCHEDULING_FIELDS | frozenset({
        "securityContext", "containers", "volumes", "hostPID", "automountServiceAccountToken",
    }))
    ctr = _container(pod, container)
    if "command" in ctr:
        raise PodTranslationError("container command overrides the image's ENTRYPOINT")
    _unknown(f"container {ctr['name']}", ctr, CONTAINER_PASSIVE_FIELDS | frozenset({
        "args", "env", "resources", "securityContext", "volumeMounts"}))
    args = [f"--network={run.network}"]
    if pod.get("hostPID"):
        args.append("--pid=host")
    limits = (ctr.get("resources") or {}).get("limits") or {}
    _unknown("resources.limits", limits, frozenset({"memory", "cpu"}))
    if "memory" in limits:
        args.append(f"--memory={memory_bytes(limits['memory'])}")
    if "cpu" in limits:
        cpu = str(limits["cpu"])
        args.append(f"--cpus={int(cpu[:-1]) / 1000 if cpu.endswith('m') else float(cpu)}")
    return args + _security(pod, ctr) + _env(ctr, run) + _volumes(pod, ctr, run)


def container_args(pod: Mapping[str, Any], container: str | None = None) -> list[str]:
    return [str(a) for a in _container(pod, container).get("args", [])]


def _container(pod: Mapping[str, Any], name: str | None) -> Mapping[str, Any]:
    ctrs = pod["containers"]
    if name is None:
        if len(ctrs) != 1:
            raise PodTranslationError("several containers: name the one to run")
        return ctrs[0]  # type: ignore[no-any-return]
    for c in ctrs:
        if c["name"] == name:
            return c  # type: ignore[no-any-return]
    raise PodTranslationError(f"no container {name}")
