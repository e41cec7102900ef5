"""A throw-away test CA and a serving certificate for 127.0.0.1, made with openssl.

The same shape as the test world's kube-apiservers: clients trust the CA from the
kubeconfig's ``certificate-authority-data`` and verify the server's name (IP SAN).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ServingCert:
    ca: Path
    cert: Path
    key: Path

    @property
    def ca_pem(self) -> bytes:
        return self.ca.read_bytes()


def _run(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_serving_cert(directory: Path, cn: str = "kubesim") -> ServingCert:
    """CA + server certificate/key in ``directory`` (reused when already there)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.crt", directory / "ca.key"
    cert, key = directory / "server.crt", directory / "server.key"
    if cert.exists() and key.exists() and ca.exists():
        return ServingCert(ca, cert, key)
    _run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "7",
         "-keyout", str(ca_key), "-out", str(ca), "-subj", f"/CN={cn}-ca",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    csr = directory / "server.csr"
    _run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
         "-subj", f"/CN={cn}")
    ext = directory / "server.ext"
    ext.write_text("basicConstraints=critical,CA:FALSE\n"
                   "keyUsage=critical,digitalSignature,keyEncipherment\n"
                   "extendedKeyUsage=serverAuth\n"
                   "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                   "authorityKeyIdentifier=keyid,issuer\n"
                   "subjectKeyIdentifier=hash\n")
    _run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
         "-CAcreateserial", "-days", "7", "-out", str(cert), "-extfile", str(ext))
    key.chmod(0o600)
    ca_key.chmod(0o600)
    return ServingCert(ca, cert, key)
