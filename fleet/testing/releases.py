"""Fake k0s release binaries and a loopback HTTP server that serves them.

A fake ``k0s`` is a tiny shell script that ``exec``s Python with an embedded program:
``k0s version`` prints its version; ``k0s worker|controller --status-socket S
--pid-file P`` writes the pid file and serves k0s's status API (``GET /status`` over the
unix socket, with ``Version`` and ``Pid``) until SIGTERM. A "broken" release exits 1
when started as a service (``k0s version`` still works, like a binary that cannot start
on this host). Padding after the ``exec`` line gives a release a realistic size without
slowing its start.

The server serves ``/k0s/<version>`` with Range support, and failure modes per version:
``404``, ``500``, ``stall`` (half the body, then silence), ``truncate`` (half the body,
then the connection closes), ``wrong-bytes``; each for the next N requests.
"""

from __future__ import annotations

import hashlib
import random
import sys
from collections import Counter
from dataclasses import dataclass

import anyio
from aiohttp import web

FAKE_K0S_PROGRAM = r'''
import json, os, signal, socket, sys
VERSION = "@VERSION@"
BROKEN = @BROKEN@
def opt(args, name, default=None):
    return args[args.index(name) + 1] if name in args else default
def serve(role, args):
    if BROKEN:
        sys.stderr.write("k0s: fatal: this binary cannot start here (simulated)\n")
        return 1
    sock_path = opt(args, "--status-socket")
    pid_file = opt(args, "--pid-file")
    stop = []
    def on_term(signum, frame):
        stop.append(signum)
        raise SystemExit(0)
    signal.signal(signal.SIGTERM, on_term)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.unlink(sock_path)
    except FileNotFoundError:
        pass
    srv.bind(sock_path)
    srv.listen(16)
    if pid_file:
        tmp = pid_file + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(str(os.getpid()))
        os.replace(tmp, pid_file)
    status = {"Version": VERSION, "Pid": os.getpid(), "PPid": os.getppid(), "Role": role,
              "SysInit": "k0s-fleet-simnode", "Args": sys.argv[1:],
              "Workloads": role != "controller", "SingleNode": False,
              "WorkerToAPIConnectionStatus": {"Message": "", "Success": True}}
    body = json.dumps(status).encode()
    head = ("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            "Connection: close\r\n\r\n" % len(body)).encode()
    try:
        while True:
            conn, _ = srv.accept()
            try:
                conn.settimeout(2)
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                conn.sendall(head + body)
            except OSError:
                pass
            finally:
                conn.close()
    finally:
        try:
            os.unlink(sock_path)
        except OSError:
            pass
def main(argv):
    if len(argv) > 1 and argv[1] == "version":
        print(VERSION)
        return 0
    if len(argv) > 1 and argv[1] in ("worker", "controller"):
        return serve(argv[1], argv[2:])
    sys.stderr.write("usage: k0s version | k0s worker|controller --status-socket S\n")
    return 2
sys.exit(main(sys.argv[1:]))
'''


def fake_k0s(version: str, *, broken: bool = False, size: int = 0,
             python: str | None = None) -> bytes:
    """The bytes of a fake k0s release (at least ``size`` bytes long)."""
    program = FAKE_K0S_PROGRAM.replace("@VERSION@", version).replace("@BROKEN@", str(broken))
    assert "'" not in program
    head = (f"#!/bin/sh\nexec '{python or sys.executable}' -S -c '{program}' \"$0\" \"$@\"\n"
            ).encode()
    rng = random.Random(f"{version}/{broken}")
    pad = bytearray()
    while len(head) + len(pad) < size:
        pad += b"#" + rng.randbytes(48).hex().encode() + b"\n"
    return head + bytes(pad)


@dataclass(frozen=True)
class Release:
    version: str
    body: bytes
    sha256: str
    url: str
    broken: bool = False


class ReleaseServer:
    """Serves fake releases on loopback; ``async with ReleaseServer() as rs``."""

    def __init__(self) -> None:
        self.releases: dict[str, Release] = {}
        self.modes: dict[str, tuple[str, int]] = {}  # version -> (mode, remaining uses)
        self.requests: Counter[str] = Counter()
        self.ranges: list[tuple[str, str]] = []  # (version, Range header) of each request
        self._runner: web.AppRunner | None = None
        self._stop = anyio.Event()
        self.base_url = ""

    async def __aenter__(self) -> ReleaseServer:
        app = web.Application()
        app.router.add_get("/k0s/{version}", self._serve)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True,
                                     shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        if self._runner is not None:
            await self._runner.cleanup()

    def add(self, version: str, *, broken: bool = False, size: int = 64 * 1024) -> Release:
        body = fake_k0s(version, broken=broken, size=size)
        rel = Release(version=version, body=body, sha256=hashlib.sha256(body).hexdigest(),
                      url=f"{self.base_url}/k0s/{version}", broken=broken)
        self.releases[version] = rel
        return rel

    def fail(self, version: str, mode: str, times: int = 1_000_000) -> None:
        """Serve ``version`` with a failure mode for the next ``times`` requests: ``404``,
        ``500``, ``wrong-bytes``, ``stall``, ``truncate`` or ``redirect:<location>``."""
        self.modes[version] = (mode, times)

    def _take_mode(self, version: str) -> str | None:
        mode = self.modes.get(version)
        if mode is None:
            return None
        name, left = mode
        if left <= 1:
            del self.modes[version]
        else:
            self.modes[version] = (name, left - 1)
        return name

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        version = request.match_info["version"]
        self.requests[version] += 1
        rel = self.releases.get(version)
        mode = self._take_mode(version)
        if rel is None or mode == "404":
            return web.Response(status=404, text="no such release\n")
        if mode == "500":
            return web.Response(status=500, text="simulated server error\n")
        if mode is not None and mode.startswith("redirect:"):  # e.g. to another origin
            return web.Response(status=302, headers={"Location": mode[len("redirect:"):]})
        body = rel.body
        if mode == "wrong-bytes":
            body = bytes(b ^ 0x5A for b in body[:64]) + body[64:]
        start = 0
        rng = request.headers.get("Range", "")
        self.ranges.append((version, rng))
        status = 200
        headers = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes"}
        if rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[6:-1])
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(body) - 1}/{len(body)}"
        part = body[start:]
        headers["Content-Length"] = str(len(part))
        resp = web.StreamResponse(status=status, headers=headers)
        await resp.prepare(request)
        if mode in ("stall", "truncate"):
            await resp.write(part[: len(part) // 2])
            if mode == "truncate" and request.transport is not None:
                request.transport.close()
                return resp
            with anyio.move_on_after(300):
                await self._stop.wait()
            return resp
        await resp.write(part)
        await resp.write_eof()
        return resp
