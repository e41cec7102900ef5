"""Taking over a shard (fleet/controllers/handoff.py): a bulk re-read of its objects goes
on where a cut-off look stopped, and starts over when it must."""

from __future__ import annotations

from fleet.controllers.handoff import BulkReread

A, B, C = ("fleet", "a"), ("fleet", "b"), ("fleet", "c")
MACHINES_AT = ("fleet", "machines")


def test_a_bulk_reread_goes_on_for_the_same_clusters_or_fewer() -> None:
    bulk = BulkReread()
    bulk.start(frozenset({A, B}))
    assert bulk.resume_from(MACHINES_AT) is None and not bulk.finished(MACHINES_AT)
    bulk.read(MACHINES_AT, "page-2")
    bulk.start(frozenset({A}))  # one given back since: the pages read still count
    assert bulk.resume_from(MACHINES_AT) == "page-2"
    bulk.read(MACHINES_AT, None)
    assert bulk.finished(MACHINES_AT)


def test_a_bulk_reread_for_more_clusters_starts_over() -> None:
    bulk = BulkReread()
    bulk.start(frozenset({A}))
    bulk.read(MACHINES_AT, None)
    bulk.start(frozenset({A, C}))  # C's objects were not kept in full when it was read
    assert not bulk.finished(MACHINES_AT) and bulk.resume_from(MACHINES_AT) is None


def test_a_list_whose_snapshot_is_gone_restarts_alone() -> None:
    bulk = BulkReread()
    bulk.start(frozenset({A}))
    bulk.read(MACHINES_AT, "page-3")
    bulk.read(("fleet", "secrets"), None)
    bulk.restart(MACHINES_AT)
    assert bulk.resume_from(MACHINES_AT) is None and bulk.finished(("fleet", "secrets"))
    bulk.reset()
    assert bulk.clusters == frozenset() and not bulk.finished(("fleet", "secrets"))
