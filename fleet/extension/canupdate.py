"""Can this change be done in place? Pure decisions for CanUpdateMachine(Set).

The rule: k0s-fleet updates in place exactly one kind of change, the k0s version.
It answers with the patch that makes ``current`` equal ``desired`` only when

- the bootstrap config is one of k0smotron's k0s kinds (``K0sWorkerConfig`` /
  ``K0sControllerConfig``, or their ``...Template`` for a MachineSet) in
  ``bootstrap.cluster.x-k8s.io``, the same kind on both sides;
- the Machine spec (``spec.template.spec`` for a MachineSet) differs in ``version``
  and nowhere else that CAPI compares, and both versions are k0s versions with the
  desired one neither older than the current one nor more than one minor ahead of it
  (:func:`fleet.contract.skew.check_move`: ``NoDowngrade``, ``OneMinorAtATime``);
- the bootstrap config spec differs at most in its own ``version`` field;
- the infrastructure object's spec is unchanged.

Otherwise the answer is Success with no patch at all, so CAPI falls back to its own
rollout (recreating Machines); the message says why, because CAPI logs it.

CAPI's comparison ignores a few Machine spec fields that never justify an update
(``CleanupMachineSpecForDiff`` in ``internal/util/inplace``); we ignore the same ones,
so a difference there never makes us decline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleet.contract.skew import check_move
from fleet.contract.versions import K0sVersion, parse_or_none
from fleet.extension.patches import FieldPath, dotted, fields_patch
from fleet.extension.wire import (
    CanUpdateMachineRequest,
    CanUpdateMachineResponse,
    CanUpdateMachineSetRequest,
    CanUpdateMachineSetResponse,
    Patch,
    PatchType,
    ResponseStatus,
)

BOOTSTRAP_GROUP = "bootstrap.cluster.x-k8s.io"
K0S_CONFIG_KINDS = frozenset({"K0sWorkerConfig", "K0sControllerConfig"})
K0S_CONFIG_TEMPLATE_KINDS = frozenset({f"{k}Template" for k in K0S_CONFIG_KINDS})

MACHINE_VERSION: FieldPath = ("spec", "version")
MACHINE_SET_VERSION: FieldPath = ("spec", "template", "spec", "version")
CONFIG_VERSION: FieldPath = ("spec", "version")
CONFIG_TEMPLATE_VERSION: FieldPath = ("spec", "template", "spec", "version")

# Machine spec fields CAPI leaves out of its in-place comparison.
IGNORED_MACHINE_SPEC_FIELDS = frozenset({
    "clusterName", "bootstrap", "infrastructureRef", "providerID",
    "minReadySeconds", "readinessGates", "taints",
})
IGNORED_DELETION_FIELDS = frozenset({
    "nodeDrainTimeoutSeconds", "nodeVolumeDetachTimeoutSeconds", "nodeDeletionTimeoutSeconds",
})
_MAX_LISTED = 5


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome: patches (all None when declining) and a one-line reason."""

    in_place: bool
    reason: str
    machine_patch: Patch | None = None
    bootstrap_patch: Patch | None = None

    @classmethod
    def decline(cls, reason: str) -> Decision:
        return cls(in_place=False, reason=f"not in place: {reason}")


# -- comparison helpers -----------------------------------------------------------------

def _pruned(value: Any) -> Any:
    """Drop members Go's omitempty would not send (null, "", [], {}), recursively."""
    if isinstance(value, Mapping):
        out = {k: _pruned(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, "", [], {})}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def machine_spec_for_diff(spec: Any) -> dict[str, Any]:
    """A Machine spec without the fields CAPI ignores, and without ``version``."""
    if not isinstance(spec, Mapping):
        return {}
    out = {k: v for k, v in spec.items()
           if k not in IGNORED_MACHINE_SPEC_FIELDS and k != "version"}
    deletion = out.get("deletion")
    if isinstance(deletion, Mapping):
        out["deletion"] = {k: v for k, v in deletion.items() if k not in IGNORED_DELETION_FIELDS}
    pruned: dict[str, Any] = _pruned(out)
    return pruned


def diff_paths(a: Any, b: Any, prefix: FieldPath = ()) -> list[FieldPath]:
    """Paths (object keys only; lists compared whole) where ``a`` and ``b`` differ."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out: list[FieldPath] = []
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                out.append((*prefix, str(key)))
            else:
                out.extend(diff_paths(a[key], b[key], (*prefix, str(key))))
        return out
    return [] if a == b else [prefix]


def _listed(paths: list[FieldPath], base: str) -> str:
    names = [f"{base}.{dotted(p)}" if p else base for p in paths[:_MAX_LISTED]]
    more = len(paths) - _MAX_LISTED
    return ", ".join(names) + (f" and {more} more" if more > 0 else "")


def _get(obj: Any, path: FieldPath) -> Any:
    cur = obj
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def _group(api_version: Any) -> str:
    return api_version.split("/", 1)[0] if isinstance(api_version, str) and "/" in api_version \
        else ""


def _version(value: Any) -> K0sVersion | None:
    return parse_or_none(value)


# -- the shared rule --------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Shape:
    """Where things live for one flavour (Machine or MachineSet)."""

    what: str                     # "Machine" / "MachineSet"
    spec_path: FieldPath          # the Machine spec inside the object
    version_path: FieldPath
    bootstrap_kinds: frozenset[str]
    bootstrap_spec_path: FieldPath
    bootstrap_version_path: FieldPath
    infra_spec_path: FieldPath


MACHINE = _Shape("Machine", ("spec",), MACHINE_VERSION, K0S_CONFIG_KINDS, ("spec",),
                 CONFIG_VERSION, ("spec",))
MACHINE_SET = _Shape("MachineSet", ("spec", "template", "spec"), MACHINE_SET_VERSION,
                     K0S_CONFIG_TEMPLATE_KINDS, ("spec", "template", "spec"),
                     CONFIG_TEMPLATE_VERSION, ("spec", "template", "spec"))


def _decide(shape: _Shape, *, current: Mapping[str, Any], desired: Mapping[str, Any],
            current_bootstrap: Mapping[str, Any] | None,
            desired_bootstrap: Mapping[str, Any] | None,
            current_infra: Mapping[str, Any] | None,
            desired_infra: Mapping[str, Any] | None,
            patch_type: PatchType) -> Decision:
    # Bootstrap config: a k0smotron k0s kind on both sides.
    if current_bootstrap is None or desired_bootstrap is None:
        return Decision.decline(f"the {shape.what} has no bootstrap config; k0s-fleet only "
                                f"updates k0smotron-bootstrapped machines")
    kinds = []
    for obj in (current_bootstrap, desired_bootstrap):
        kind, group = obj.get("kind"), _group(obj.get("apiVersion"))
        if group != BOOTSTRAP_GROUP or kind not in shape.bootstrap_kinds:
            return Decision.decline(
                f"bootstrap config {kind or '(no kind)'} ({group or 'no group'}) is not one of "
                f"k0smotron's {', '.join(sorted(shape.bootstrap_kinds))} ({BOOTSTRAP_GROUP})")
        kinds.append(kind)
    if kinds[0] != kinds[1]:
        return Decision.decline(f"bootstrap config kind changes from {kinds[0]} to {kinds[1]}")

    # The version itself.
    cur_raw, want_raw = _get(current, shape.version_path), _get(desired, shape.version_path)
    cur_v, want_v = _version(cur_raw), _version(want_raw)
    vpath = dotted(shape.version_path)
    if want_v is None:
        return Decision.decline(f"desired {vpath} {want_raw!r} is not a k0s version")
    if cur_v is None:
        return Decision.decline(f"current {vpath} {cur_raw!r} is not a k0s version")
    # k0s's skew rules (fleet.contract.skew): never down, at most one minor at a time; the decline
    # names the rule.
    refusal = check_move(cur_v, want_v, what=vpath)
    if refusal is not None:
        return Decision.decline(str(refusal))

    # Everything else CAPI compares in the Machine spec must already match.
    others = diff_paths(machine_spec_for_diff(_get(current, shape.spec_path)),
                        machine_spec_for_diff(_get(desired, shape.spec_path)))
    if others:
        return Decision.decline(f"more than the k0s version changes: "
                                f"{_listed(others, dotted(shape.spec_path))}")

    # Bootstrap config spec: only its own version may differ.
    cur_bspec = _pruned(_get(current_bootstrap, shape.bootstrap_spec_path) or {})
    want_bspec = _pruned(_get(desired_bootstrap, shape.bootstrap_spec_path) or {})
    bootstrap_diffs = [p for p in diff_paths(cur_bspec, want_bspec) if p != ("version",)]
    if bootstrap_diffs:
        return Decision.decline(
            f"more than the k0s version changes: {kinds[0]} "
            f"{_listed(bootstrap_diffs, dotted(shape.bootstrap_spec_path))}")
    bootstrap_version = _get(desired_bootstrap, shape.bootstrap_version_path)
    if bootstrap_version not in (None, "") and _version(bootstrap_version) is None:
        return Decision.decline(f"{kinds[0]} version {bootstrap_version!r} is not a k0s version")

    # Infrastructure: untouched.
    if current_infra is None or desired_infra is None:
        return Decision.decline(f"the {shape.what} request carries no infrastructure object")
    infra_diffs = diff_paths(_pruned(_get(current_infra, shape.infra_spec_path) or {}),
                             _pruned(_get(desired_infra, shape.infra_spec_path) or {}))
    if infra_diffs:
        kind = desired_infra.get("kind") or "infrastructure object"
        return Decision.decline(
            f"more than the k0s version changes: {kind} "
            f"{_listed(infra_diffs, dotted(shape.infra_spec_path))}")

    machine_patch = fields_patch(current, desired, [shape.version_path], patch_type)
    bootstrap_patch = fields_patch(current_bootstrap, desired_bootstrap,
                                   [shape.bootstrap_version_path], patch_type)
    if machine_patch is None and bootstrap_patch is None:
        return Decision(in_place=True, reason=f"nothing to change: k0s {cur_v} already desired")
    return Decision(
        in_place=True,
        reason=f"k0s {cur_v} -> {want_v}: updated in place by k0s-fleet",
        machine_patch=machine_patch,
        bootstrap_patch=bootstrap_patch,
    )


def decide_machine(req: CanUpdateMachineRequest,
                   patch_type: PatchType = PatchType.JSON_PATCH) -> Decision:
    return _decide(
        MACHINE,
        current=req.current.machine, desired=req.desired.machine,
        current_bootstrap=req.current.bootstrap_config,
        desired_bootstrap=req.desired.bootstrap_config,
        current_infra=req.current.infrastructure_machine,
        desired_infra=req.desired.infrastructure_machine,
        patch_type=patch_type,
    )


def decide_machine_set(req: CanUpdateMachineSetRequest,
                       patch_type: PatchType = PatchType.JSON_PATCH) -> Decision:
    return _decide(
        MACHINE_SET,
        current=req.current.machine_set, desired=req.desired.machine_set,
        current_bootstrap=req.current.bootstrap_config_template,
        desired_bootstrap=req.desired.bootstrap_config_template,
        current_infra=req.current.infrastructure_machine_template,
        desired_infra=req.desired.infrastructure_machine_template,
        patch_type=patch_type,
    )


def machine_answer(d: Decision) -> CanUpdateMachineResponse:
    return CanUpdateMachineResponse(
        status=ResponseStatus.SUCCESS, message=d.reason,
        machine_patch=d.machine_patch, bootstrap_config_patch=d.bootstrap_patch,
    )


def machine_set_answer(d: Decision) -> CanUpdateMachineSetResponse:
    return CanUpdateMachineSetResponse(
        status=ResponseStatus.SUCCESS, message=d.reason,
        machine_set_patch=d.machine_patch, bootstrap_config_template_patch=d.bootstrap_patch,
    )


def can_update_machine(req: CanUpdateMachineRequest,
                       patch_type: PatchType = PatchType.JSON_PATCH) -> CanUpdateMachineResponse:
    return machine_answer(decide_machine(req, patch_type))


def can_update_machine_set(req: CanUpdateMachineSetRequest,
                           patch_type: PatchType = PatchType.JSON_PATCH,
                           ) -> CanUpdateMachineSetResponse:
    return machine_set_answer(decide_machine_set(req, patch_type))


def declined_machine(reason: str) -> CanUpdateMachineResponse:
    return CanUpdateMachineResponse(status=ResponseStatus.SUCCESS, message=reason)


def declined_machine_set(reason: str) -> CanUpdateMachineSetResponse:
    return CanUpdateMachineSetResponse(status=ResponseStatus.SUCCESS, message=reason)
