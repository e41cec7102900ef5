"""Kubeconfigs from Secrets carry inline credentials only (issue #29 finding 1), and the
light transport never writes key material to disk nor takes insecure-skip-tls-verify
together with a CA (finding 6)."""

from __future__ import annotations

import base64
import copy
import datetime
import os
import ssl
import tempfile
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given
from hypothesis import strategies as st

from fleet.config.errors import ConfigError
from fleet.config.loader import load_config
from fleet.config.models import FleetConfig
from fleet.kube import light
from fleet.kube.inline import (
    CLUSTER_FILE_KEYS,
    CLUSTER_KEYS,
    USER_FILE_KEYS,
    USER_KEYS,
    KubeconfigNotAllowedError,
    check_inline,
)
from fleet.kube.light import Credentials, KubeconfigError, credentials_from_kubeconfig
from fleet.world.clusters import kubeconfig_from_secret, kubeconfig_secret

CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n").decode()


def kubeconfig(cluster: dict[str, Any] | None = None, user: dict[str, Any] | None = None,
               **top: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443",
                                               "certificate-authority-data": CA,
                                               **(cluster or {})}}],
        "users": [{"name": "u", "user": {"token": "t", **(user or {})}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        **top,
    }


def refused(config: dict[str, Any], *, allow_files: bool = False) -> KubeconfigNotAllowedError:
    with pytest.raises(KubeconfigNotAllowedError) as e:
        check_inline(config, what="kubeconfig Secret ns/c-kubeconfig", allow_files=allow_files)
    return e.value


def test_inline_credentials_pass() -> None:
    check_inline(kubeconfig())
    check_inline(kubeconfig(user={"client-certificate-data": "x", "client-key-data": "y"},
                            cluster={"tls-server-name": "api.internal"}))
    check_inline(kubeconfig(cluster={"insecure-skip-tls-verify": True,
                                     "certificate-authority-data": None}))


@pytest.mark.parametrize(("user", "field"), [
    ({"exec": {"command": "touch", "args": ["/tmp/x"], "apiVersion":
               "client.authentication.k8s.io/v1"}}, "users[0].user.exec"),
    ({"auth-provider": {"name": "gcp"}}, "users[0].user.auth-provider"),
    ({"tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"},
     "users[0].user.tokenFile"),
    ({"token-file": "/x"}, "users[0].user.token-file"),
    ({"client-certificate": "/etc/c.pem"}, "users[0].user.client-certificate"),
    ({"client-key": "/etc/k.pem"}, "users[0].user.client-key"),
    ({"username": "a", "password": "b"}, "users[0].user.username"),
    ({"as": "system:admin"}, "users[0].user.as"),
])
def test_user_fields_that_read_files_or_run_code_are_refused(user: dict[str, Any],
                                                              field: str) -> None:
    e = refused(kubeconfig(user=user))
    assert e.field == field
    assert str(e).startswith(f"kubeconfig Secret ns/c-kubeconfig: {field} is not allowed in "
                             "a kubeconfig from a Secret")


@pytest.mark.parametrize(("cluster", "field"), [
    ({"certificate-authority": "/etc/ca.pem"}, "clusters[0].cluster.certificate-authority"),
    ({"proxy-url": "http://evil:3128"}, "clusters[0].cluster.proxy-url"),
    ({"server": "file:///etc/passwd"}, "clusters[0].cluster.server"),
    ({"insecure-skip-tls-verify": True}, "clusters[0].cluster.insecure-skip-tls-verify"),
    ({"insecure-skip-tls-verify": "false"}, "clusters[0].cluster.insecure-skip-tls-verify"),
    ({"whatever": 1}, "clusters[0].cluster.whatever"),
])
def test_cluster_fields_are_refused(cluster: dict[str, Any], field: str) -> None:
    assert refused(kubeconfig(cluster=cluster)).field == field


def test_unused_entries_and_unknown_keys_are_checked_too() -> None:
    config = kubeconfig()
    config["users"].append({"name": "other", "user": {"exec": {"command": "sh"}}})
    assert refused(config).field == "users[1].user.exec"
    assert refused(kubeconfig(preference={})).field == "preference"
    config = kubeconfig()
    config["contexts"][0]["context"]["cluster-extra"] = "x"
    assert refused(config).field == "contexts[0].context.cluster-extra"
    config = kubeconfig()
    config["users"][0]["exec"] = {"command": "sh"}  # beside "user", not in it
    assert refused(config).field == "users[0].exec"


def test_the_operator_may_allow_file_paths_never_exec() -> None:
    files = kubeconfig(user={"tokenFile": "/t", "client-certificate": "/c",
                             "client-key": "/k"},
                       cluster={"certificate-authority": "/ca"})
    refused(files)
    check_inline(files, allow_files=True)
    for user in ({"exec": {"command": "sh"}}, {"auth-provider": {"name": "x"}}):
        assert refused(kubeconfig(user=user), allow_files=True).field.endswith(
            next(iter(user)))
    assert refused(kubeconfig(cluster={"proxy-url": "http://p"}), allow_files=True).field \
        == "clusters[0].cluster.proxy-url"


@given(st.dictionaries(st.text(min_size=1, max_size=20), st.just("x"), min_size=1,
                       max_size=4))
def test_any_user_key_outside_the_inline_list_is_refused(extra: dict[str, str]) -> None:
    config = kubeconfig(user=extra)
    unknown = [k for k in extra if k not in USER_KEYS]
    if unknown:
        assert refused(config).field == f"users[0].user.{unknown[0]}"
    else:
        check_inline(config)


def test_the_file_keys_are_what_the_light_transport_reads() -> None:
    # whatever light.credentials_from_kubeconfig reads from a file is in the *_FILE_KEYS
    assert {"tokenFile", "client-certificate", "client-key"} == USER_FILE_KEYS
    assert {"certificate-authority"} == CLUSTER_FILE_KEYS
    assert not (USER_KEYS | CLUSTER_KEYS) & {"exec", "auth-provider", "proxy-url"}


def test_kubeconfig_from_secret_names_the_secret_and_field() -> None:
    secret = kubeconfig_secret("c-kubeconfig", "tenant", "c",
                               kubeconfig(user={"exec": {"command": "sh"}}))
    with pytest.raises(KubeconfigNotAllowedError, match=r"kubeconfig Secret "
                       r"tenant/c-kubeconfig: users\[0\]\.user\.exec is not allowed"):
        kubeconfig_from_secret(secret)
    secret = kubeconfig_secret("c-kubeconfig", "tenant", "c",
                               kubeconfig(user={"tokenFile": "/t"}))
    with pytest.raises(KubeconfigNotAllowedError, match="tokenFile"):
        kubeconfig_from_secret(secret)
    assert kubeconfig_from_secret(secret, allow_files=True)["users"][0]["user"] == \
        {"token": "t", "tokenFile": "/t"}


# -- the operator's allowance in the fleet YAML --------------------------------------------

def test_fleet_yaml_allowance_per_namespace(tmp_path: Path) -> None:
    f = tmp_path / "fleet.yaml"
    f.write_text("clusters:\n  kubeconfigSecrets:\n    allowFileCredentials: [infra]\n")
    config = load_config(str(f), env={})
    assert config.clusters.kubeconfig_secrets.allows_files("infra")
    assert not config.clusters.kubeconfig_secrets.allows_files("tenant")
    assert not FleetConfig().clusters.kubeconfig_secrets.allows_files("default")
    f.write_text("clusters:\n  kubeconfigSecrets:\n    allowFileCredentials: [a, a]\n")
    with pytest.raises(ConfigError, match=r"clusters\.kubeconfigSecrets\."
                       r"allowFileCredentials: .*duplicate namespace 'a'"):
        load_config(str(f), env={})
    f.write_text("clusters:\n  kubeconfigSecrets:\n    allowExec: [a]\n")
    with pytest.raises(ConfigError, match=r"clusters\.kubeconfigSecrets\.allowExec"):
        load_config(str(f), env={})


# -- finding 6: insecure-skip-tls-verify with a CA ------------------------------------------

def test_insecure_together_with_a_ca_is_refused_for_every_kubeconfig() -> None:
    # the management kubeconfig (an operator's file) too, as client-go refuses it
    with pytest.raises(KubeconfigError, match="insecure-skip-tls-verify together with"):
        credentials_from_kubeconfig(kubeconfig(cluster={"insecure-skip-tls-verify": True}))
    with pytest.raises(KubeconfigError, match="not a boolean"):
        credentials_from_kubeconfig(kubeconfig(cluster={"insecure-skip-tls-verify": "no"}))
    no_ca = copy.deepcopy(kubeconfig(cluster={"insecure-skip-tls-verify": True}))
    del no_ca["clusters"][0]["cluster"]["certificate-authority-data"]
    assert credentials_from_kubeconfig(no_ca).insecure


# -- key material never touches disk ------------------------------------------------------

def _key_pair() -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fleet-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM,
                              serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def _files_under(root: str) -> set[str]:
    out: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        out.update(os.path.join(dirpath, n) for n in (*dirnames, *filenames))
    return out


def test_client_key_is_loaded_without_writing_a_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() follows TMPDIR again
    assert tempfile.gettempdir() == str(tmp_path)
    cert, key = _key_pair()
    creds = Credentials(server="https://127.0.0.1:1", ca_pem=None, cert_pem=cert,
                        key_pem=key)
    seen: list[tuple[str, str, set[str]]] = []

    class Spy(ssl.SSLContext):
        def load_cert_chain(self, certfile: Any, keyfile: Any = None,
                            password: Any = None) -> None:
            # what the key is read from, and what is in the temporary directory meanwhile
            seen.append((str(certfile), os.readlink(certfile) if str(certfile).startswith(
                "/proc/") else str(certfile), _files_under(str(tmp_path))))
            super().load_cert_chain(certfile, keyfile, password)

    monkeypatch.setattr(ssl, "SSLContext", Spy)
    before = set(os.listdir(f"/proc/{os.getpid()}/fd"))
    ctx = light._new_ssl_context(creds)
    assert isinstance(ctx, ssl.SSLContext)
    [(path, target, meanwhile)] = seen
    assert path.startswith("/proc/self/fd/") and target.startswith("/memfd:"), (path, target)
    assert meanwhile == set()  # nothing written, not even while loading
    assert _files_under(str(tmp_path)) == set()
    monkeypatch.undo()
    assert set(os.listdir(f"/proc/{os.getpid()}/fd")) <= before  # the memfd is closed
    assert not hasattr(light, "tempfile")  # and the module has no way to write one
    with pytest.raises(KubeconfigError, match="unusable"):
        light._new_ssl_context(Credentials(server="https://x", cert_pem=cert,
                                           key_pem=_key_pair()[1]))


def test_without_memfd_a_clear_error_not_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = _key_pair()
    monkeypatch.delattr(os, "memfd_create")
    with pytest.raises(KubeconfigError, match="memfd_create"):
        light._new_ssl_context(Credentials(server="https://x", cert_pem=cert, key_pem=key))
