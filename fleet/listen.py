"""Opening a served endpoint's listening socket, with an error that names it.

A port already taken (another process, or two replicas on one host given the same
``status.port``) surfaces from asyncio as a bare ``OSError`` deep in a task group's
traceback; :func:`start_site` turns it into :class:`ListenError`, which says which
endpoint, which setting and which address, so the command can exit with one line.
"""

from __future__ import annotations

from aiohttp import web


class ListenError(Exception):
    """A served endpoint could not open its listening socket."""


async def start_site(site: web.TCPSite, *, what: str, setting: str, host: str,
                     port: int) -> None:
    """``site.start()``; an ``OSError`` from binding becomes :class:`ListenError`
    naming ``what`` (the endpoint) and ``setting`` (where its port is configured)."""
    try:
        await site.start()
    except OSError as e:
        raise ListenError(f"{what}: cannot listen on {host}:{port} ({setting}): "
                          f"{e.strerror or e}") from e


__all__ = ["ListenError", "start_site"]
