"""What the commands share: the fleet config from ``--config``/``--kubeconfig``/``--context``/
``--namespace``, one way to report a bad config, exit codes, and the management cluster's
client.

The management cluster's kubeconfig is found as kubectl finds it, first match wins:

1. ``--kubeconfig FILE`` (the fleet YAML's ``management.kubeconfig`` /
   ``K0S_FLEET_MANAGEMENT__KUBECONFIG`` when the flag is not given);
2. ``$KUBECONFIG``: a ``:``-separated list of files, merged as kubectl merges them (files
   that do not exist are skipped; clusters, contexts and users by name, the first file that
   has a name wins; ``current-context`` from the first file that sets one; a relative path
   in a file is relative to that file);
3. the in-cluster service account (skipped when ``--context`` is given: it has no contexts);
4. ``~/.kube/config``.

``--context`` picks a context of whichever kubeconfig was found (default: its
``current-context``). These files are the operator's own and trusted as before: unlike the
workload clusters' kubeconfig Secrets (:mod:`fleet.kube.inline`) they may name files and
exec plugins.

``-n/--namespace`` is the controller's namespace (where FleetUpgrades live and the rollout
ConfigMap is). Without it: the fleet YAML's ``management.namespace`` when a local one sets
it, else the namespace of the kubeconfig context in use (in a Pod: the service account's),
else the chart's default ``k0s-fleet-system``.

The fleet YAML ``plan``, ``status`` and ``upgrade --dry-run`` judge by (:func:`fleet_session`):
``--config FILE`` (or ``$K0S_FLEET_CONFIG``), a local file for offline use; else the one
the controller runs with, read from the cluster: the chart renders ``values.fleet`` into
a ConfigMap in the release namespace (labels ``app.kubernetes.io/part-of=k0s-fleet``,
``app.kubernetes.io/component=controller``, key ``fleet.yaml``), with the keys the chart
sets in the controller's environment instead (``extension.*``; read from its Deployment
when that can be read); else the defaults. Each says which it used
(:attr:`ResolvedConfig.source`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import yaml

from fleet.cli.exit import Exit
from fleet.config.errors import ConfigError, ConfigProblem
from fleet.config.loader import CONFIG_PATH_ENV, load_config
from fleet.config.models import FleetConfig
from fleet.contract.nodeplan import version_slug
from fleet.kube import ForbiddenError, KubeClient, KubeError
from fleet.kube.light import KubeconfigError
from fleet.kube.resources import CONFIGMAPS, DEPLOYMENTS

# The chart's default release namespace (docs/operations.md installs it there).
CHART_NAMESPACE = "k0s-fleet-system"
# How the CLI finds the fleet YAML the controller runs with: the chart's ConfigMap
# (charts/k0s-fleet/templates/configmap.yaml) carries these labels and this key.
CONTROLLER_CONFIG_SELECTOR = ("app.kubernetes.io/part-of=k0s-fleet,"
                              "app.kubernetes.io/component=controller")
CONTROLLER_CONFIG_KEY = "fleet.yaml"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


EXIT_CODES_HELP = """exit codes:
  0    done (upgrade: the FleetUpgrade is Complete)
  1    failed (unreachable cluster, API error; upgrade: Failed, or selects no cluster;
       upgrade --dry-run / plan --version: a cluster refused, or none selected)
  2    bad input: arguments, fleet config, kubeconfig, or no controller in the namespace
  3    upgrade: not complete within --timeout
  4    controller: lost its Lease (the Pod restarts)
  130  interrupted (Ctrl-C)"""


class BadInputError(Exception):
    """Something the user gave (an argument, a kubeconfig) is unusable: exit 2."""


def add_fleet_arguments(p: argparse.ArgumentParser) -> None:
    """--config, --kubeconfig, --context and -n/--namespace, as every fleet-side command
    takes them; the exit codes in the help's epilog."""
    p.add_argument("--config", help="fleet YAML (default: $K0S_FLEET_CONFIG, else defaults)")
    p.add_argument("--kubeconfig", help="management cluster kubeconfig (overrides the "
                   "config's management.kubeconfig; default: $KUBECONFIG, else in-cluster "
                   "service account, else ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: its current-context)")
    p.add_argument("-n", "--namespace", help="the controller's namespace, where FleetUpgrades "
                   "and the rollout ConfigMap live (default: management.namespace of a local "
                   "fleet YAML, else the kubeconfig context's namespace, else "
                   f"{CHART_NAMESPACE})")
    add_exit_codes_epilog(p)


def add_exit_codes_epilog(p: argparse.ArgumentParser) -> None:
    p.epilog = EXIT_CODES_HELP
    p.formatter_class = argparse.RawDescriptionHelpFormatter


OUTPUT_FORMATS = ("text", "json", "yaml")
WIDE_FORMATS = ("text", "wide", "json", "yaml")


def add_output_argument(p: argparse.ArgumentParser, *, wide: bool = False) -> None:
    if wide:
        p.add_argument("-o", "--output", choices=WIDE_FORMATS, default="text",
                       help="text, wide (text with more columns: executor, current step, "
                       "node, time in step), json or yaml (default: text)")
        return
    p.add_argument("-o", "--output", choices=OUTPUT_FORMATS, default="text",
                   help="text, json or yaml (default: text)")


def dump(doc: Any, output: str) -> str:
    """``doc`` as ``json`` (indented) or ``yaml``, ending in a newline."""
    if output == "yaml":
        return str(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    import json  # noqa: PLC0415

    return json.dumps(doc, indent=2) + "\n"


def upgrade_object(name: str, namespace: str, version: str,
                   selector: dict[str, Any] | None) -> dict[str, Any]:
    """The FleetUpgrade ``k0s-fleet upgrade`` writes (and ``--dry-run`` imagines)."""
    spec: dict[str, Any] = {"version": version}
    if selector:
        spec["clusterSelector"] = selector
    return {"apiVersion": "fleet.k0s-fleet.io/v1alpha1", "kind": "FleetUpgrade",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "k0s-fleet"}},
            "spec": spec}


def default_name(version: str) -> str:
    return f"upgrade-{version_slug(version)}"


def fleet_config(args: argparse.Namespace) -> FleetConfig:
    """The fleet config (``--config``, else ``$K0S_FLEET_CONFIG``, else defaults) with
    ``--kubeconfig``/``--context``/``--namespace`` applied. Raises :class:`ConfigError`."""
    given = {k: v for k, v in (("kubeconfig", args.kubeconfig), ("context", args.context),
                               ("namespace", getattr(args, "namespace", None))) if v}
    return load_config(args.config, overrides={"management": given} if given else None)


def report_config_error(command: str, e: ConfigError) -> int:
    """One line per problem on stderr, each naming its key; the exit code to return."""
    for line in str(e).splitlines():
        print(f"k0s-fleet {command}: config: {line}", file=sys.stderr)
    return Exit.BAD_CONFIG


def fail(command: str, message: object) -> int:
    print(f"k0s-fleet {command}: {message}", file=sys.stderr)
    return Exit.FAILED


def run_command(command: str, main: Callable[[argparse.Namespace], Awaitable[int]],
                args: argparse.Namespace, *, bad_input: tuple[type[Exception], ...] = (),
                failures: tuple[type[Exception], ...] = ()) -> int:
    """``main(args)`` under anyio, its errors as exit codes with one line each on stderr:
    a bad config (a line per problem), a :class:`BadInputError` or ``bad_input`` is
    :attr:`Exit.BAD_CONFIG`; an API error, an OS error, a ValueError or one of
    ``failures`` is :attr:`Exit.FAILED`; Ctrl-C is :attr:`Exit.INTERRUPTED`."""
    failed: tuple[type[Exception], ...] = (KubeError, OSError, ValueError, *failures)
    bad: tuple[type[Exception], ...] = (BadInputError, *bad_input)
    try:
        return anyio.run(main, args)
    except ConfigError as e:
        return report_config_error(command, e)
    except bad as e:
        print(f"k0s-fleet {command}: {e}", file=sys.stderr)
        return Exit.BAD_CONFIG
    except failed as e:
        return fail(command, e)
    except KeyboardInterrupt:
        return Exit.INTERRUPTED


# -- kubeconfig resolution ---------------------------------------------------------------

_PATH_FIELDS = {"clusters": ("cluster", ("certificate-authority",)),
                "users": ("user", ("client-certificate", "client-key", "tokenFile"))}


def _absolute_paths(doc: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """``doc`` with its relative file paths made relative to ``base`` (as kubectl does for
    each file of a merged list)."""
    out = dict(doc)
    for section, (inner, fields) in _PATH_FIELDS.items():
        items = []
        for item in doc.get(section) or []:
            if not isinstance(item, Mapping) or not isinstance(item.get(inner), Mapping):
                items.append(item)
                continue
            body = dict(item[inner])
            for f in fields:
                v = body.get(f)
                if isinstance(v, str) and v and not Path(v).is_absolute():
                    body[f] = str(base / v)
            items.append({**item, inner: body})
        if section in doc:
            out[section] = items
    return out


def merge_kubeconfigs(docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge kubeconfigs as kubectl merges ``$KUBECONFIG``: clusters, contexts and users by
    name, the first file that has a name wins; ``current-context`` (and any other top-level
    key) from the first file that sets it."""
    merged: dict[str, Any] = {"apiVersion": "v1", "kind": "Config"}
    named: dict[str, dict[str, Any]] = {"clusters": {}, "contexts": {}, "users": {}}
    for doc in docs:
        for key, value in doc.items():
            if key in named:
                for item in value or []:
                    if isinstance(item, Mapping) and item.get("name") is not None:
                        named[key].setdefault(str(item["name"]), dict(item))
            elif value not in (None, "", {}, []) and merged.get(key) in (None, "", {}, []):
                merged[key] = value
    for key, items in named.items():
        merged[key] = list(items.values())
    return merged


def _read_kubeconfig(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise BadInputError(f"kubeconfig {path}: cannot read it: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise BadInputError(f"kubeconfig {path}: not YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BadInputError(f"kubeconfig {path}: not a kubeconfig (a YAML mapping)")
    return data


def kubeconfig_from_env(value: str) -> dict[str, Any] | None:
    """``$KUBECONFIG`` (``value``) loaded and merged; None when it names no existing file."""
    paths = [Path(p).expanduser() for p in value.split(os.pathsep) if p]
    docs = [_absolute_paths(_read_kubeconfig(p), p.absolute().parent)
            for p in paths if p.exists()]
    return merge_kubeconfigs(docs) if docs else None


def home_kubeconfig() -> Path:
    return Path("~/.kube/config").expanduser()


def find_kubeconfig(management: Any, environ: Mapping[str, str]
                    ) -> tuple[dict[str, Any], Path | None] | None:
    """The kubeconfig to use (steps 1, 2 and 4 of this module's docstring) and the
    directory its relative paths are relative to; None for the in-cluster service account
    (step 3). Raises :class:`BadInputError` when there is none or it is unusable."""
    if management.kubeconfig:
        path = Path(management.kubeconfig).expanduser().absolute()
        return _read_kubeconfig(path), path.parent
    merged = kubeconfig_from_env(environ["KUBECONFIG"]) if environ.get("KUBECONFIG") else None
    if merged is not None:
        return merged, None
    if not management.context and in_cluster_available(environ):
        return None
    home = home_kubeconfig()
    if home.exists():
        return _read_kubeconfig(home), home.parent
    raise BadInputError(
        "no management kubeconfig: pass --kubeconfig, set $KUBECONFIG or "
        "management.kubeconfig, or create ~/.kube/config"
        + (" (--context given: the in-cluster service account has no contexts)"
           if management.context else " (not running in a cluster)"))


def in_cluster_available(environ: Mapping[str, str]) -> bool:
    """Running in a Pod: the service account's environment as client-go checks it."""
    return bool(environ.get("KUBERNETES_SERVICE_HOST") and environ.get("KUBERNETES_SERVICE_PORT"))


async def management_client(config: FleetConfig, *,
                            environ: Mapping[str, str] | None = None) -> KubeClient:
    """A client for the management cluster, the kubeconfig found in the order of this
    module's docstring (:func:`find_kubeconfig`). An unusable kubeconfig raises
    :class:`BadInputError`."""
    m = config.management
    found = find_kubeconfig(m, os.environ if environ is None else environ)
    try:
        if found is None:
            return KubeClient.in_cluster(name="management", transport="auto")
        data, base_dir = found
        return await KubeClient.from_kubeconfig(data, name="management", context=m.context,
                                                transport="auto", base_dir=base_dir)
    except KubeconfigError as e:
        raise BadInputError(str(e)) from None


# -- the namespace and the fleet YAML the commands judge by ------------------------------


def context_namespace(kubeconfig: Mapping[str, Any], context: str | None) -> str | None:
    """The namespace of ``context`` (default: the kubeconfig's ``current-context``), as
    kubectl takes it; None when the context sets none (or does not exist: connecting
    reports that)."""
    name = context or kubeconfig.get("current-context")
    for item in kubeconfig.get("contexts") or []:
        if isinstance(item, Mapping) and item.get("name") == name:
            body = item.get("context")
            ns = body.get("namespace") if isinstance(body, Mapping) else None
            return str(ns) if isinstance(ns, str) and ns else None
    return None


def default_namespace(management: Any, environ: Mapping[str, str], *,
                      service_account_namespace: Path = SERVICE_ACCOUNT_NAMESPACE
                      ) -> tuple[str, str]:
    """(namespace, where it came from) when neither ``-n`` nor a local fleet YAML names
    one: the kubeconfig context's namespace, in a Pod the service account's, else the
    chart's default. Raises :class:`BadInputError` as :func:`find_kubeconfig` does."""
    found = find_kubeconfig(management, environ)
    if found is not None:
        ns = context_namespace(found[0], management.context)
        if ns:
            return ns, "the kubeconfig context's namespace"
    else:
        try:
            ns = service_account_namespace.read_text(encoding="utf-8").strip()
        except OSError:
            ns = ""
        if ns:
            return ns, "the service account's namespace"
    return CHART_NAMESPACE, "the chart's default namespace"


@dataclass(frozen=True, slots=True)
class ResolvedConfig:
    """The fleet config a command judges by, and what to tell the user about it."""

    config: FleetConfig
    source: str  # e.g. "ConfigMap k0s-fleet-system/k0s-fleet (controller's)"
    namespace_from: str  # "-n/--namespace", "the fleet YAML", "the kubeconfig context's ..."
    local: bool = False  # from --config / $K0S_FLEET_CONFIG

    def banner(self) -> str:
        return (f"config: {self.source}; namespace {self.config.management.namespace} "
                f"({self.namespace_from})")


def local_config_path(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    return getattr(args, "config", None) or environ.get(CONFIG_PATH_ENV) or None


def with_namespace(config: FleetConfig, namespace: str) -> FleetConfig:
    return config.model_copy(update={"management": config.management.model_copy(
        update={"namespace": namespace})})


def _management_overrides(config: FleetConfig) -> dict[str, Any]:
    m = config.management
    given = {"kubeconfig": m.kubeconfig, "context": m.context, "namespace": m.namespace}
    return {"management": {k: v for k, v in given.items() if v}}


def config_from_text(text: str, where: str, management: FleetConfig,
                     env: Mapping[str, str] | None = None) -> FleetConfig:
    """A fleet YAML held in memory (a ConfigMap's), validated as a file is, with ``env``
    (the ``K0S_FLEET_*`` variables the controller gets next to it) and the management
    settings the CLI found laid over it; problems name ``where``."""
    with tempfile.TemporaryDirectory(prefix="k0s-fleet-cli-") as tmp:
        path = Path(tmp) / "fleet.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            return load_config(path, env=dict(env or {}),
                               overrides=_management_overrides(management))
        except ConfigError as e:
            raise ConfigError([ConfigProblem(where if p.path == str(path) else
                                             f"{where}: {p.path}", p.message)
                               for p in e.problems], where) from None


async def controller_configmap(mgmt: KubeClient, namespace: str
                               ) -> tuple[dict[str, Any] | None, str]:
    """The chart's fleet YAML ConfigMap in ``namespace`` (None when there is none) and, when
    none was found, why. Several releases in one namespace are refused (bad input)."""
    try:
        items = (await mgmt.list(CONFIGMAPS, namespace,
                                 label_selector=CONTROLLER_CONFIG_SELECTOR)).items
    except ForbiddenError:
        return None, f"not allowed to list ConfigMaps in namespace {namespace!r}"
    found = [cm for cm in items if CONTROLLER_CONFIG_KEY in (cm.get("data") or {})]
    if len(found) > 1:
        names = ", ".join(sorted(str(cm["metadata"]["name"]) for cm in found))
        raise BadInputError(f"several k0s-fleet controller configs in namespace "
                            f"{namespace!r} ({names}): pass --config")
    if not found:
        return None, f"no controller config found in namespace {namespace!r}"
    return found[0], ""


def deployment_environment(deployment: Mapping[str, Any], configmap: str
                           ) -> dict[str, str] | None:
    """The ``K0S_FLEET_*`` variables with literal values of the container that mounts
    ``configmap`` in ``deployment`` (the keys the chart sets itself: ``extension.*``,
    ``status.port``, and any in ``extraEnv``), without ``K0S_FLEET_CONFIG`` and
    ``management.*`` (the CLI finds those itself); None when it does not mount it."""
    spec = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    volumes = {str(v.get("name")) for v in spec.get("volumes") or []
               if (v.get("configMap") or {}).get("name") == configmap}
    if not volumes:
        return None
    for c in spec.get("containers") or []:
        if not any(m.get("name") in volumes for m in c.get("volumeMounts") or []):
            continue
        return {str(e["name"]): str(e["value"]) for e in c.get("env") or []
                if "value" in e and str(e.get("name", "")).startswith("K0S_FLEET_")
                and e["name"] != CONFIG_PATH_ENV
                and not str(e["name"]).upper().startswith("K0S_FLEET_MANAGEMENT__")}
    return None


async def controller_environment(mgmt: KubeClient, namespace: str, configmap: str
                                 ) -> tuple[dict[str, str], str | None]:
    """:func:`deployment_environment` of the chart's Deployment in ``namespace`` that
    mounts ``configmap``, and its name; ({}, None) when there is none or Deployments
    cannot be read (the ConfigMap alone then stands)."""
    try:
        items = (await mgmt.list(DEPLOYMENTS, namespace,
                                 label_selector=CONTROLLER_CONFIG_SELECTOR)).items
    except KubeError:
        return {}, None
    for d in sorted(items, key=lambda d: str(d["metadata"]["name"])):
        env = deployment_environment(d, configmap)
        if env is not None:
            return env, str(d["metadata"]["name"])
    return {}, None


@contextlib.asynccontextmanager
async def fleet_session(args: argparse.Namespace, *, environ: Mapping[str, str] | None = None,
                        controller_config: bool = True
                        ) -> AsyncIterator[tuple[KubeClient, ResolvedConfig]]:
    """The management client and the fleet config to judge by, found as this module's
    docstring says: the namespace (``-n``, a local fleet YAML's, the context's, the
    chart's), then the fleet YAML (``--config``/``$K0S_FLEET_CONFIG``, else the
    controller's ConfigMap in that namespace, else the defaults). ``controller_config``
    False: only the namespace is wanted (the local config stands)."""
    env = os.environ if environ is None else environ
    local = fleet_config(args)
    path = local_config_path(args, env)
    if getattr(args, "namespace", None):
        ns_from = "-n/--namespace"
    elif "namespace" in local.management.model_fields_set:
        ns_from = "management.namespace"
    else:
        ns, ns_from = default_namespace(local.management, env)
        local = with_namespace(local, ns)
    namespace = local.management.namespace
    mgmt = await management_client(local, environ=env)
    async with mgmt:
        if path is not None or not controller_config:
            flag = "--config" if getattr(args, "config", None) else f"${CONFIG_PATH_ENV}"
            yield mgmt, ResolvedConfig(local, f"{flag} {path} (local)" if path else "defaults",
                                       ns_from, local=True)
            return
        cm, why = await controller_configmap(mgmt, namespace)
        if cm is None:
            yield mgmt, ResolvedConfig(local, f"defaults ({why})", ns_from)
            return
        name = str(cm["metadata"]["name"])
        where = f"ConfigMap {namespace}/{name}"
        env, deployment = await controller_environment(mgmt, namespace, name)
        config = config_from_text(str(cm["data"][CONTROLLER_CONFIG_KEY]), where, local, env)
        source = f"{where} (controller's)" if deployment is None else \
            f"{where} with the chart's settings from Deployment {deployment} (controller's)"
        yield mgmt, ResolvedConfig(config, source, ns_from)
