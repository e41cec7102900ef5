"""kubesim's store and patch semantics without a server (the contract test covers the
wire: tests/integration/test_kube_client.py)."""

from __future__ import annotations

import asyncio

import pytest

from fleet.testing.kubesim.patches import (
    JSON_PATCH,
    MERGE,
    STRATEGIC,
    PatchError,
    apply_patch,
    json_patch,
)
from fleet.testing.kubesim.store import KINDS, ApiError, ClusterStore, Selection

NODES = KINDS[("", "v1", "nodes")]
CONFIGMAPS = KINDS[("", "v1", "configmaps")]


def test_merge_patch_removes_with_null_and_replaces_lists() -> None:
    doc = {"a": {"b": 1, "c": 2}, "l": [1, 2]}
    assert apply_patch(MERGE, doc, {"a": {"b": None}, "l": [3]}) == {"a": {"c": 2}, "l": [3]}
    assert doc == {"a": {"b": 1, "c": 2}, "l": [1, 2]}  # untouched


def test_strategic_merge_merges_conditions_by_type() -> None:
    doc = {"status": {"conditions": [{"type": "Ready", "status": "True"},
                                     {"type": "DiskPressure", "status": "False"}]}}
    out = apply_patch(STRATEGIC, doc, {"status": {"conditions": [
        {"type": "Ready", "status": "False"}]}})
    assert out["status"]["conditions"] == [{"type": "Ready", "status": "False"},
                                           {"type": "DiskPressure", "status": "False"}]
    with pytest.raises(PatchError, match=r"\$patch"):
        apply_patch(STRATEGIC, doc, {"$patch": "replace"})


def test_json_patch_ops_and_failed_test() -> None:
    doc = {"a": [1, 2], "b": {"c": 1}}
    out = json_patch(doc, [{"op": "add", "path": "/a/-", "value": 3},
                           {"op": "replace", "path": "/b/c", "value": 2},
                           {"op": "move", "from": "/b", "path": "/d"}])
    assert out == {"a": [1, 2, 3], "d": {"c": 2}}
    with pytest.raises(PatchError, match="test"):
        json_patch(doc, [{"op": "test", "path": "/b/c", "value": 9}])
    with pytest.raises(PatchError, match="unsupported patch content type"):
        apply_patch("application/apply-patch+yaml", doc, {})


def test_stale_resource_version_conflicts_and_noop_keeps_version() -> None:
    s = ClusterStore("c")
    created = s.create(CONFIGMAPS, "ns", {"metadata": {"name": "a"}, "data": {"k": "v"}})
    with pytest.raises(ApiError) as e:
        s.create(CONFIGMAPS, "ns", {"metadata": {"name": "a"}})
    assert (e.value.code, e.value.reason) == (409, "AlreadyExists")
    patched = s.patch(CONFIGMAPS, "ns", "a", content_type=MERGE, patch={"data": {"k": "w"}})
    assert patched.rv > created.rv
    with pytest.raises(ApiError) as e:
        s.patch(CONFIGMAPS, "ns", "a", content_type=MERGE,
                patch={"metadata": {"resourceVersion": str(created.rv)}, "data": {"k": "x"}})
    assert (e.value.code, e.value.reason) == (409, "Conflict")
    same = s.patch(CONFIGMAPS, "ns", "a", content_type=MERGE, patch={"data": {"k": "w"}})
    assert same.rv == patched.rv


def test_status_subresource_and_main_resource_keep_each_others_parts() -> None:
    s = ClusterStore("c")
    s.create(NODES, "", {"metadata": {"name": "n"}, "spec": {}, "status": {"phase": "x"}})
    main = s.patch(NODES, "", "n", content_type=MERGE,
                   patch={"spec": {"unschedulable": True}, "status": {"phase": "lost"}})
    assert main.decode()["status"] == {"phase": "x"}
    status = s.patch(NODES, "", "n", content_type=MERGE, subresource="status",
                     patch={"spec": {"unschedulable": False}, "status": {"phase": "y"}})
    assert status.decode()["spec"] == {"unschedulable": True}
    assert status.decode()["status"] == {"phase": "y"}


def test_watch_resumes_from_history_and_expired_version_is_gone() -> None:
    async def body() -> None:
        s = ClusterStore("c", history=3)
        first = s.create(CONFIGMAPS, "ns", {"metadata": {"name": "a"}})
        for i in range(2):
            s.patch(CONFIGMAPS, "ns", "a", content_type=MERGE, patch={"data": {"i": str(i)}})
        _, backlog = s.watch(Selection(CONFIGMAPS, "ns"), str(first.rv))
        assert [c.type for c in backlog] == ["MODIFIED", "MODIFIED"]
        for i in range(3):
            s.patch(CONFIGMAPS, "ns", "a", content_type=JSON_PATCH,
                    patch=[{"op": "add", "path": "/data/j", "value": str(i)}])
        with pytest.raises(ApiError) as e:
            s.watch(Selection(CONFIGMAPS, "ns"), str(first.rv))
        assert e.value.code == 410
        w, backlog = s.watch(Selection(CONFIGMAPS, "ns"), str(s.rv))
        assert backlog == []
        s.delete(CONFIGMAPS, "ns", "a")
        assert w.wakeup.is_set()
        item = w.pending.popleft()
        assert item is not None and (item[1], item[2].name) == ("DELETED", "a")
        assert not w.pending

    asyncio.run(body())


def test_pages_cover_everything_once() -> None:
    s = ClusterStore("c")
    for i in range(7):
        s.create(CONFIGMAPS, "ns", {"metadata": {"name": f"p{i}", "labels": {"odd": str(i % 2)}}})
    names, cont = [], None
    while True:
        items, _rv, cont, _left = s.page(Selection(CONFIGMAPS, "ns"), 3, cont)
        names += [o.name for o in items]
        if not cont:
            break
    assert names == [f"p{i}" for i in range(7)]
    from fleet.testing.kubesim.store import parse_label_selector  # noqa: PLC0415
    odd = s.select(Selection(CONFIGMAPS, "ns", parse_label_selector("odd in (1)")))
    assert [o.name for o in odd] == ["p1", "p3", "p5"]
