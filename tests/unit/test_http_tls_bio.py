"""The light transport's TLS over memory BIOs reads its socket 64 KiB at a time and
writes ciphertext into its BIO a record's worth at a time (OpenSSL's memory BIO keeps
the largest buffer it ever held: a thousand watch connections that once read 256 KiB at
a time kept 250 MiB, issue 33), and still delivers every byte. Client and server meet
in memory: no socket, no sleep."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from pathlib import Path
from typing import Any

import pytest

from fleet.kube.http import BIO_WRITE_BYTES, SOCKET_READ_BYTES, _TlsProtocol
from fleet.testing.kubesim.certs import make_serving_cert

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # _TlsProtocol is an asyncio.Protocol


class _Recorder:
    """The client's incoming BIO, recording the size of every write."""

    def __init__(self, bio: ssl.MemoryBIO) -> None:
        self.bio = bio
        self.writes: list[int] = []

    def write(self, data: Any) -> int:
        self.writes.append(len(data))
        return self.bio.write(data)

    @property
    def pending(self) -> int:
        return self.bio.pending


class _Wire(asyncio.Transport):
    """What the client writes, kept for the server to read."""

    max_size = 256 * 1024  # asyncio's socket transports' read size

    def __init__(self) -> None:
        super().__init__()
        self.sent = bytearray()

    def write(self, data: Any) -> None:
        self.sent += data

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def test_a_large_read_goes_into_the_bio_in_record_sized_pieces(tmp_path: Path) -> None:
    cert = make_serving_cert(tmp_path)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert.cert, cert.key)
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.load_verify_locations(cafile=str(cert.ca))
    s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)

    reader = asyncio.StreamReader(limit=1 << 20)
    proto = _TlsProtocol(client_ctx, "localhost", reader)
    recorder = _Recorder(proto._in)
    proto._in = recorder  # type: ignore[assignment]
    wire = _Wire()
    proto.connection_made(wire)
    assert wire.max_size == SOCKET_READ_BYTES  # reads of at most 64 KiB
    for _ in range(10):  # the handshake, in memory
        s_in.write(bytes(wire.sent))
        wire.sent.clear()
        with contextlib.suppress(ssl.SSLWantReadError):
            server.do_handshake()
        if s_out.pending:
            proto.data_received(s_out.read())
        if proto.handshake.done() and not wire.sent:
            break
    assert proto.handshake.done() and proto.handshake.exception() is None
    s_in.write(bytes(wire.sent))  # the client's Finished and whatever follows
    wire.sent.clear()
    with pytest.raises(ssl.SSLWantReadError):
        server.read(1)
    payload = os.urandom(256 * 1024 - 1) + b"\n"
    server.write(payload)
    ciphertext = s_out.read()
    assert len(ciphertext) > 4 * BIO_WRITE_BYTES
    recorder.writes.clear()
    proto.data_received(ciphertext)  # as one socket read of a loop that fell behind
    assert max(recorder.writes) <= BIO_WRITE_BYTES
    assert sum(recorder.writes) == len(ciphertext)
    assert await reader.readexactly(len(payload)) == payload
