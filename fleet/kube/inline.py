"""Kubeconfigs someone other than the operator wrote: inline credentials only.

A workload cluster's kubeconfig comes from a Secret (Cluster API's ``<cluster>-kubeconfig``)
that whoever may write Secrets in the cluster's namespace can replace: in Cluster API
multi-tenancy, the cluster's owner. Such a kubeconfig must not steer the controller
beyond naming a server and the credentials to send it. So it may carry only

- clusters: ``server`` (http or https), ``certificate-authority-data``, ``tls-server-name``,
  ``insecure-skip-tls-verify`` (a boolean, and never together with a CA: client-go refuses
  the combination too), ``disable-compression``, ``extensions``;
- users: ``token``, ``client-certificate-data``, ``client-key-data``, ``extensions``;
- contexts: ``cluster``, ``user``, ``namespace``, ``extensions``;
- at the top: ``apiVersion``, ``kind``, ``clusters``, ``users``, ``contexts``,
  ``current-context``, ``preferences``, ``extensions``.

Everything else is refused, naming the field: ``exec`` and ``auth-provider`` (they run
code in the controller), ``tokenFile``, ``client-certificate``, ``client-key`` and
``certificate-authority`` (they read the controller's own files, its service account token
among them, and send them to the Secret's server), ``proxy-url``, impersonation, basic
auth, and any key this list does not know. Only an operator may allow the file paths,
per namespace (``clusters.kubeconfigSecrets.allowFileCredentials`` in the fleet YAML,
:func:`check_inline` ``allow_files``); nothing allows ``exec`` or ``auth-provider``: a
kubeconfig from a Secret is always used with the ``light`` transport, never with
kubernetes-asyncio (which runs exec plugins).

Every entry is checked, used by the current context or not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleet.kube.light import KubeconfigError

TOP_KEYS = frozenset({"apiVersion", "kind", "clusters", "users", "contexts",
                      "current-context", "preferences", "extensions"})
CLUSTER_KEYS = frozenset({"server", "certificate-authority-data", "tls-server-name",
                          "insecure-skip-tls-verify", "disable-compression", "extensions"})
USER_KEYS = frozenset({"token", "client-certificate-data", "client-key-data", "extensions"})
CONTEXT_KEYS = frozenset({"cluster", "user", "namespace", "extensions"})
# File paths: refused unless the operator allows them for the Secret's namespace.
CLUSTER_FILE_KEYS = frozenset({"certificate-authority"})
USER_FILE_KEYS = frozenset({"tokenFile", "client-certificate", "client-key"})

_WHY = {
    "exec": "it would run a command in the controller",
    "auth-provider": "it would run an authentication plugin in the controller",
    "proxy-url": "requests would go through a proxy the Secret names",
    "username": "basic authentication is not supported",
    "password": "basic authentication is not supported",
}
_FILE_WHY = ("it would make the controller read one of its own files and send it to the "
             "Secret's server; an operator may allow file paths for this namespace with "
             "clusters.kubeconfigSecrets.allowFileCredentials")


class KubeconfigNotAllowedError(KubeconfigError, ValueError):
    """A kubeconfig from a Secret with a field that is not an inline credential.
    ``field``: where, e.g. ``users[0].user.exec``. A ValueError too, as every other
    unusable kubeconfig Secret (KubeconfigSecretError)."""

    def __init__(self, what: str, field: str, why: str | None = None) -> None:
        self.field = field
        super().__init__(f"{what}: {field} is not allowed in a kubeconfig from a Secret"
                         + (f" ({why})" if why else ""))


def _entries(kubeconfig: Mapping[str, Any], section: str, inner: str, keys: frozenset[str],
             file_keys: frozenset[str], *, what: str, allow_files: bool) -> None:
    items = kubeconfig.get(section)
    if items is None:
        return
    if not isinstance(items, list):
        raise KubeconfigNotAllowedError(what, section, "not a list")
    for i, item in enumerate(items):
        where = f"{section}[{i}]"
        if not isinstance(item, Mapping):
            raise KubeconfigNotAllowedError(what, where, "not a mapping")
        for k in item:
            if k not in ("name", inner):
                raise KubeconfigNotAllowedError(what, f"{where}.{k}", "unknown field")
        body = item.get(inner)
        if body is None:
            continue
        if not isinstance(body, Mapping):
            raise KubeconfigNotAllowedError(what, f"{where}.{inner}", "not a mapping")
        for k in body:
            field = f"{where}.{inner}.{k}"
            if k in keys or (allow_files and k in file_keys):
                continue
            if k in file_keys:
                raise KubeconfigNotAllowedError(what, field, _FILE_WHY)
            raise KubeconfigNotAllowedError(what, field, _WHY.get(str(k), "not an inline "
                                                                  "credential"))
        if inner == "cluster":
            _check_cluster(body, f"{where}.{inner}", what=what)
        elif inner == "user":
            for k in ("token", "client-certificate-data", "client-key-data"):
                if k in body and not isinstance(body[k], str):
                    raise KubeconfigNotAllowedError(what, f"{where}.{inner}.{k}",
                                                    "not a string")


def _check_cluster(cluster: Mapping[str, Any], where: str, *, what: str) -> None:
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise KubeconfigNotAllowedError(what, f"{where}.server", "not an http(s) URL")
    insecure = cluster.get("insecure-skip-tls-verify")
    if insecure is not None and not isinstance(insecure, bool):
        raise KubeconfigNotAllowedError(what, f"{where}.insecure-skip-tls-verify",
                                        "not a boolean")
    if insecure and (cluster.get("certificate-authority-data")
                     or cluster.get("certificate-authority")):
        raise KubeconfigNotAllowedError(
            what, f"{where}.insecure-skip-tls-verify",
            "together with a certificate authority it would silently turn verification "
            "off; client-go refuses the combination")


def check_inline(kubeconfig: Mapping[str, Any], *, what: str = "kubeconfig",
                 allow_files: bool = False) -> None:
    """Raise :class:`KubeconfigNotAllowedError` naming the first field of ``kubeconfig``
    that is not an inline credential (see the module docstring). ``what`` starts the
    message (e.g. ``kubeconfig Secret ns/name``); ``allow_files``: the operator allows
    file paths (tokenFile, client-certificate, client-key, certificate-authority)."""
    if not isinstance(kubeconfig, Mapping):
        raise KubeconfigNotAllowedError(what, "(top)", "not a mapping")
    for k in kubeconfig:
        if k not in TOP_KEYS:
            raise KubeconfigNotAllowedError(what, str(k), "unknown field")
    _entries(kubeconfig, "clusters", "cluster", CLUSTER_KEYS, CLUSTER_FILE_KEYS, what=what,
             allow_files=allow_files)
    _entries(kubeconfig, "users", "user", USER_KEYS, USER_FILE_KEYS, what=what,
             allow_files=allow_files)
    _entries(kubeconfig, "contexts", "context", CONTEXT_KEYS, frozenset(), what=what,
             allow_files=allow_files)


__all__ = ["KubeconfigNotAllowedError", "check_inline"]
