"""Patches that make a few fields of one object equal to another's, in CAPI's formats.

CAPI applies an extension's patch to the *whole* current object (RFC 6902 JSON Patch
or RFC 7386 JSON Merge Patch) and then copies back only the spec part. The patches
built here touch exactly the listed paths: add where the member is missing, replace
where it differs, remove where the desired object has none.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from fleet.extension.wire import Patch, PatchType

FieldPath = tuple[str, ...]

_ABSENT = object()


def pointer(path: FieldPath) -> str:
    """RFC 6901 JSON Pointer for a path of object keys."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in path)


def dotted(path: FieldPath) -> str:
    return ".".join(path)


def lookup(obj: Any, path: FieldPath) -> Any:
    """The value at ``path``, or the module's private ABSENT marker."""
    cur = obj
    for key in path:
        if not isinstance(cur, Mapping) or key not in cur:
            return _ABSENT
        cur = cur[key]
    return cur


def is_absent(value: Any) -> bool:
    return value is _ABSENT


def _nest(keys: Sequence[str], value: Any) -> Any:
    for key in reversed(keys):
        value = {key: value}
    return value


def json_patch_ops(current: Mapping[str, Any], desired: Mapping[str, Any],
                   paths: Sequence[FieldPath]) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = []
    for path in paths:
        want = lookup(desired, path)
        have = lookup(current, path)
        if not is_absent(have) and not is_absent(want) and have == want:
            continue
        if is_absent(want):
            if not is_absent(have):
                ops.append({"op": "remove", "path": pointer(path)})
            continue
        if not is_absent(have):
            ops.append({"op": "replace", "path": pointer(path), "value": want})
            continue
        # Missing member: add at the first missing level, carrying the rest nested.
        depth = 0
        cur: Any = current
        while depth < len(path) and isinstance(cur, Mapping) and path[depth] in cur:
            cur = cur[path[depth]]
            depth += 1
        if not isinstance(cur, Mapping):
            raise ValueError(
                f"cannot add {pointer(path)}: {pointer(path[:depth])} is not an object")
        ops.append({"op": "add", "path": pointer(path[: depth + 1]),
                    "value": _nest(path[depth + 1:], want)})
    return ops


def merge_patch_doc(current: Mapping[str, Any], desired: Mapping[str, Any],
                    paths: Sequence[FieldPath]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for path in paths:
        want = lookup(desired, path)
        have = lookup(current, path)
        if not is_absent(have) and not is_absent(want) and have == want:
            continue
        if is_absent(want) and is_absent(have):
            continue
        if isinstance(want, Mapping | list) or (want is None):
            # A merge patch merges objects and cannot say "null"; only scalars are ours.
            raise ValueError(f"{pointer(path)}: merge patch only carries scalar values")
        node = doc
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = None if is_absent(want) else want
    return doc


def encode_json(doc: Any) -> bytes:
    """Compact JSON bytes, as Go's encoding/json would write them."""
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def fields_patch(current: Mapping[str, Any], desired: Mapping[str, Any],
                 paths: Sequence[FieldPath],
                 patch_type: PatchType = PatchType.JSON_PATCH) -> Patch | None:
    """The patch setting ``paths`` of ``current`` to their values in ``desired``.

    None when nothing differs at those paths (no patch is the clearest "no change").
    """
    if patch_type is PatchType.JSON_PATCH:
        ops = json_patch_ops(current, desired, paths)
        return Patch(patch_type=patch_type, patch=encode_json(ops)) if ops else None
    doc = merge_patch_doc(current, desired, paths)
    return Patch(patch_type=patch_type, patch=encode_json(doc)) if doc else None
