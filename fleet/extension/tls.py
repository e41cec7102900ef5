"""A server TLS context whose certificate follows its files.

cert-manager (or anything else) rotates the serving certificate by rewriting the
mounted files; a Secret volume swaps a symlink. Every new TLS connection checks the
files' identity (inode, size, mtime, by ``os.stat`` through symlinks) during the
ClientHello and, when they changed, loads them into a fresh context that this and later
connections use. Connections already open keep the certificate they started with.
A half-written pair (new cert, old key) fails to load: the previous certificate stays
in use and the load is tried again on the next connection.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from pathlib import Path

log = logging.getLogger(__name__)

Fingerprint = tuple[tuple[int, int, int, int], ...]


def _fingerprint(*paths: Path) -> Fingerprint:
    out = []
    for p in paths:
        st = os.stat(p)
        out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def _server_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(certfile=str(cert_file), keyfile=str(key_file))
    return ctx


class ReloadingServerTLS:
    """Owns the listener's SSLContext; ``context`` is what the server socket uses."""

    def __init__(self, cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str]):
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self._lock = threading.Lock()
        self._fingerprint = _fingerprint(self.cert_file, self.key_file)
        # Fails loudly at start-up: a server without a usable certificate must not start.
        self._current = _server_context(self.cert_file, self.key_file)
        self._failed_fingerprint: Fingerprint | None = None
        self.reloads = 0
        self.last_error: str | None = None
        # The listening context: carries the initial certificate and hands every
        # handshake over to the freshest context.
        self.context = _server_context(self.cert_file, self.key_file)
        self.context.sni_callback = self._on_client_hello

    def current(self) -> ssl.SSLContext:
        """The freshest loaded context, reloading first when the files changed."""
        try:
            fp = _fingerprint(self.cert_file, self.key_file)
        except OSError as e:
            self._note_failure(None, f"cannot stat certificate files: {e}")
            return self._current
        if fp in (self._fingerprint, self._failed_fingerprint):
            return self._current
        with self._lock:
            if fp == self._fingerprint:
                return self._current
            try:
                fresh = _server_context(self.cert_file, self.key_file)
            except (ssl.SSLError, OSError) as e:
                self._note_failure(fp, f"cannot load {self.cert_file} / {self.key_file}: {e}")
                return self._current
            self._current, self._fingerprint = fresh, fp
            self._failed_fingerprint = None
            self.reloads += 1
            self.last_error = None
            log.info("serving certificate reloaded from %s", self.cert_file)
            return fresh

    def _note_failure(self, fp: Fingerprint | None, message: str) -> None:
        if fp is None or fp != self._failed_fingerprint:
            log.warning("%s; keeping the previous certificate", message)
        self._failed_fingerprint = fp
        self.last_error = message

    def _on_client_hello(self, conn: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
                         ctx: ssl.SSLContext) -> int | None:
        fresh = self.current()
        if fresh is not ctx:
            conn.context = fresh
        return None
