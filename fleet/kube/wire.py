"""Decoding watch lines and list pages straight into what a listener keeps.

A workload cluster's Node is 5-20 KB of JSON; ``json.loads`` makes several hundred Python
objects of it (images, managedFields, conditions), and a cache that keeps a handful of
facts throws them away at once. With a thousand clusters watching the same Nodes, one
patch of a Node is a thousand such decodes: CPU, and garbage for the collector.

An :class:`ObjectDecoder` (built from what the layer that knows what it keeps names,
e.g. :mod:`fleet.world.records`) turns one object's raw JSON into the small JSON subset its
listener reads, skipping every other field without building it (msgspec typed Structs).
This module frames that decoder into watch lines and list pages:

- :func:`decode_watch_line`: ``{"type": ..., "object": <subset>}`` for ADDED, MODIFIED
  and DELETED; bookmarks and ERROR events (small) as ``json.loads`` reads them.
- :func:`decode_list_page`: a list answer with each item decoded to its subset.

Whatever the Struct does not take (a field of an unexpected type:
``msgspec.ValidationError``) is decoded by ``json.loads`` as before (a list page then
whole), so odd objects reach the listener whole and its own checks name what is wrong;
what is not JSON at all raises as ``json.loads`` raises. The fast path never decides
differently from the slow one: it only skips what the listener never reads.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec

KubeObject = dict[str, Any]
S = TypeVar("S", bound=msgspec.Struct)

OBJECT_EVENTS = frozenset({"ADDED", "MODIFIED", "DELETED"})
RECENT_LINES = 256
# A remembered line is found by its first bytes (the event's type, the object's kind,
# name and resourceVersion come first), then compared whole: hashing a whole 14 KB line
# cost more than comparing it (a bytes object's hash reads all of it).
LINE_KEY_BYTES = 256


class SharedObject(dict[str, Any]):
    """A decoded object that every watch which read the same line is handed (the same
    dict): its readers must not change it, and may remember what they made of it by its
    identity (:class:`fleet.kube.cache.Remembered`)."""

    __slots__ = ()


class ObjectDecoder(Generic[S]):
    """Decodes an object's JSON into ``struct`` (a msgspec Struct naming only the fields
    its listener reads; every other field is skipped, never built) and hands on
    ``subset(struct)``: the plain JSON subset the listener reads. A watch line or a list
    page is decoded in one pass, the object inside it straight into ``struct``."""

    def __init__(self, struct: type[S], subset: Callable[[S], KubeObject], *,
                 remember: int = RECENT_LINES) -> None:
        self.struct = struct
        self.subset = subset
        # The last ``remember`` object events decoded, by their line: every watch of the
        # same objects (a thousand clusters sharing Nodes) reads the very same line, and
        # all but the first are given the first one's decode (the same dict: readers do
        # not change it).
        self.remember = remember
        # the line's first LINE_KEY_BYTES -> (the line, its decode)
        self._recent: dict[bytes, tuple[bytes, Any]] = {}
        self.hits = 0
        self._object = msgspec.json.Decoder(struct)
        line = msgspec.defstruct(f"{struct.__name__}Line", [
            ("type", Any, None), ("object", struct | None, None)])
        self._line: msgspec.json.Decoder[Any] = msgspec.json.Decoder(line)
        page = msgspec.defstruct(f"{struct.__name__}Page", [
            ("items", list[struct] | None, None),  # type: ignore[valid-type]
            ("metadata", _ListMeta | None, None)])
        self._page: msgspec.json.Decoder[Any] = msgspec.json.Decoder(page)

    def __call__(self, raw: bytes) -> KubeObject:
        """The subset of one object's JSON; ``msgspec.ValidationError`` when a field the
        listener reads is not of the kind the Struct takes (read it whole instead)."""
        return self.subset(self._object.decode(raw))


class _ListMeta(msgspec.Struct, rename="camel"):
    resource_version: Any = None
    remaining_item_count: Any = None
    continue_: Any = msgspec.field(default=None, name="continue")  # a Python keyword


def decode_object(raw: bytes, decoder: ObjectDecoder[Any]) -> Any:
    """One object by ``decoder``, or whole (``json.loads``) where it does not fit."""
    try:
        return decoder(raw)
    except msgspec.ValidationError:
        return json.loads(raw)


def decode_watch_line(line: bytes, decoder: ObjectDecoder[Any]) -> Any:
    """One watch line; raises ``ValueError`` (``json.JSONDecodeError``) as ``json.loads``
    would for a line that is not JSON. ADDED, MODIFIED and DELETED events come as
    ``{"type": ..., "object": <subset>}``; bookmarks, ERROR events, anything else, and
    an event whose object the Struct does not take, as ``json.loads`` reads them.
    A line the decoder read a moment ago (another watch of the same objects) is given
    that decode again: the same dict, which its readers must not change."""
    recent = decoder._recent
    key = line[:LINE_KEY_BYTES]
    hit = recent.get(key)
    if hit is not None and hit[0] == line:
        decoder.hits += 1
        return hit[1]
    try:
        outer = decoder._line.decode(line)
    except msgspec.DecodeError:  # not JSON, or not the Struct's shape: as before
        return json.loads(line)
    if outer.type in OBJECT_EVENTS and outer.object is not None:
        event = {"type": outer.type,
                 "object": SharedObject(decoder.subset(outer.object))}
        if decoder.remember:
            recent.pop(key, None)  # (another line of the same start: the newer is kept)
            recent[key] = (line, event)
            if len(recent) > decoder.remember:
                del recent[next(iter(recent))]
        return event
    return json.loads(line)  # bookmarks, ERROR, anything else: small, read whole


def decode_list_page(data: bytes, decoder: ObjectDecoder[Any]) -> Any:
    """One list answer (``{"metadata": ..., "items": [...]}``) with its items decoded by
    ``decoder``; a page with an item the Struct does not take is read whole; raises
    ``ValueError`` as ``json.loads`` would for what is not JSON."""
    try:
        page = decoder._page.decode(data)
    except msgspec.DecodeError:
        return json.loads(data)
    meta: dict[str, Any] = {}
    if page.metadata is not None:
        m = page.metadata
        for key, value in (("resourceVersion", m.resource_version),
                           ("continue", m.continue_),
                           ("remainingItemCount", m.remaining_item_count)):
            if value is not None:
                meta[key] = value
    items = page.items or []
    page.items = None
    subset = decoder.subset
    out = [subset(item) for item in items]
    del items
    return {"metadata": meta, "items": out}
