"""A throw-away CA and serving certificate, for tests and local runs without cert-manager.

Needs the ``cryptography`` package (a dev dependency); production certificates come
from cert-manager or the chart (see docs/runtime-extension.md).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True, slots=True)
class CertPair:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: Path, *, cert_name: str = "tls.crt",
              key_name: str = "tls.key", ca_name: str = "ca.crt") -> tuple[Path, Path, Path]:
        """Write the three PEM files (the key as 0600); returns (cert, key, ca) paths."""
        directory.mkdir(parents=True, exist_ok=True)
        cert, key, ca = directory / cert_name, directory / key_name, directory / ca_name
        key.touch(mode=0o600, exist_ok=True)
        key.write_bytes(self.key_pem)
        cert.write_bytes(self.cert_pem)
        ca.write_bytes(self.ca_pem)
        return cert, key, ca


def make_cert_pair(dns_names: list[str] | None = None, *, common_name: str = "k0s-fleet",
                   ip_addresses: list[str] | None = None, days: int = 30) -> CertPair:
    """A fresh CA and a serving certificate it signed (ECDSA P-256)."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{common_name} test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True,
            content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in (dns_names or ["localhost"])]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in (ip_addresses or ["127.0.0.1"])]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return CertPair(
        ca_pem=ca.public_bytes(serialization.Encoding.PEM),
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()),
    )
