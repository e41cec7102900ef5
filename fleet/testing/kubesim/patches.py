"""The three patch formats of the Kubernetes API, applied to plain JSON objects.

* JSON merge patch (RFC 7386, ``application/merge-patch+json``): what k0s-fleet sends;
* JSON patch (RFC 6902, ``application/json-patch+json``): add, remove, replace, move,
  copy, test;
* strategic merge patch (``application/strategic-merge-patch+json``): a merge patch in
  which the lists Kubernetes merges by key for the objects served here (Node
  conditions and addresses by ``type``, taints by ``key``, containers, volumes and
  env by ``name``) are merged element by element instead of replaced. Directives
  (``$patch``, ``$retainKeys``, ``$setElementOrder``) are refused as unsupported.

Every function returns a new object and raises :class:`PatchError` naming what was
wrong; the input is never modified.
"""

from __future__ import annotations

import copy
from typing import Any

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
PATCH_TYPES = (MERGE, JSON_PATCH, STRATEGIC)

# list field name -> the key its elements are merged by (strategic merge patch)
MERGE_KEYS: dict[str, str] = {
    "conditions": "type", "addresses": "type", "taints": "key",
    "containers": "name", "initContainers": "name", "volumes": "name", "env": "name",
    "ports": "containerPort", "ownerReferences": "uid",
}


class PatchError(ValueError):
    """A patch that cannot be applied (the message says why)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def strategic_merge_patch(target: Any, patch: Any, field: str = "") -> Any:
    if isinstance(patch, dict):
        for key in patch:
            if key.startswith("$"):
                raise PatchError(f"strategic merge patch directive {key!r} is not supported "
                                 "by this API server")
        out = dict(target) if isinstance(target, dict) else {}
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = strategic_merge_patch(out.get(key), value, key)
        return out
    if isinstance(patch, list) and field in MERGE_KEYS and isinstance(target, list):
        key = MERGE_KEYS[field]
        merged = [copy.deepcopy(x) for x in target]
        for item in patch:
            if not isinstance(item, dict) or key not in item:
                raise PatchError(f"strategic merge patch: every element of {field!r} needs "
                                 f"its merge key {key!r}")
            at = next((i for i, x in enumerate(merged)
                       if isinstance(x, dict) and x.get(key) == item[key]), None)
            if at is None:
                merged.append(strategic_merge_patch(None, item))
            else:
                merged[at] = strategic_merge_patch(merged[at], item)
        return merged
    return copy.deepcopy(patch)


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise PatchError(f"JSON patch path {path!r} is not a JSON pointer")
    if path == "":
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> tuple[Any, str]:
    if not parts:
        raise PatchError(f"JSON patch path {path!r}: the whole document cannot be the target")
    node = doc
    for p in parts[:-1]:
        node = _child(node, p, path)
    return node, parts[-1]


def _child(node: Any, part: str, path: str) -> Any:
    if isinstance(node, dict):
        if part not in node:
            raise PatchError(f"JSON patch path {path!r}: no member {part!r}")
        return node[part]
    if isinstance(node, list):
        return node[_index(node, part, path, allow_end=False)]
    raise PatchError(f"JSON patch path {path!r}: {part!r} is inside a scalar")


def _index(node: list[Any], part: str, path: str, *, allow_end: bool) -> int:
    if part == "-" and allow_end:
        return len(node)
    if not part.isdigit():
        raise PatchError(f"JSON patch path {path!r}: {part!r} is not an array index")
    i = int(part)
    if i > len(node) or (i == len(node) and not allow_end):
        raise PatchError(f"JSON patch path {path!r}: index {i} out of range")
    return i


def _remove(doc: Any, path: str) -> Any:
    parent, last = _parent(doc, _pointer(path), path)
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"JSON patch remove {path!r}: no such member")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, path, allow_end=False))
    raise PatchError(f"JSON patch remove {path!r}: parent is a scalar")


def _add(doc: Any, path: str, value: Any, *, replace: bool = False) -> None:
    parent, last = _parent(doc, _pointer(path), path)
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise PatchError(f"JSON patch replace {path!r}: no such member")
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list):
        if replace:
            parent[_index(parent, last, path, allow_end=False)] = copy.deepcopy(value)
        else:
            parent.insert(_index(parent, last, path, allow_end=True), copy.deepcopy(value))
    else:
        raise PatchError(f"JSON patch {path!r}: parent is a scalar")


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902."""
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for n, op in enumerate(ops):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"JSON patch operation {n} needs 'op' and 'path'")
        kind, path = op["op"], op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError(f"JSON patch operation {n} ({kind}) needs 'value'")
        if kind == "add":
            _add(doc, path, op["value"])
        elif kind == "replace":
            _add(doc, path, op["value"], replace=True)
        elif kind == "remove":
            _remove(doc, path)
        elif kind in ("move", "copy"):
            src = op.get("from")
            if not isinstance(src, str):
                raise PatchError(f"JSON patch operation {n} ({kind}) needs 'from'")
            node = doc
            for p in _pointer(src):
                node = _child(node, p, src)
            value = _remove(doc, src) if kind == "move" else copy.deepcopy(node)
            _add(doc, path, value)
        elif kind == "test":
            node = doc
            for p in _pointer(path):
                node = _child(node, p, path)
            if node != op["value"]:
                raise PatchError(f"JSON patch test at {path!r} failed")
        else:
            raise PatchError(f"JSON patch operation {n}: unknown op {kind!r}")
    return doc


def apply_patch(content_type: str, target: dict[str, Any], patch: Any) -> Any:
    if content_type == MERGE:
        return merge_patch(target, patch)
    if content_type == STRATEGIC:
        return strategic_merge_patch(target, patch)
    if content_type == JSON_PATCH:
        return json_patch(target, patch)
    raise PatchError(f"unsupported patch content type {content_type!r}; use one of "
                     f"{', '.join(PATCH_TYPES)}")
