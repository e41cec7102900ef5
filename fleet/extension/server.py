"""The HTTPS endpoint CAPI calls: discovery and the three in-place hooks.

- TLS only: the one listener wraps every connection in TLS (plain HTTP fails the
  handshake); the certificate follows its files (:mod:`fleet.extension.tls`).
- Every answer is JSON in the hook's response shape. A known hook path always answers
  HTTP 200, with ``status: Failure`` and a one-line message when the body is not JSON,
  does not validate, or the handler failed (as CAPI's own extension server does); an
  unknown path answers 404, a method other than POST 405, a body over the limit 413,
  each with a Failure body. Never a 500, never a stack trace on the wire.
- CAPI appends ``?timeout=<Go duration>``; handlers get 80% of it, so a slow API
  server produces a Failure CAPI can read instead of a timeout it cannot.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
from aiohttp import web
from opentelemetry.trace import Tracer
from pydantic import ValidationError

from fleet.artifacts import ArtifactResolver
from fleet.config.models import FleetConfig
from fleet.extension.activation import own_endpoint
from fleet.extension.catalog import DISCOVERY_PATH, HANDLERS, hook_path
from fleet.extension.handlers import ExtensionHandlers
from fleet.extension.policyhold import policy_hold_from_config
from fleet.extension.tls import ReloadingServerTLS
from fleet.extension.update import (
    ExtensionDrives,
    UpdateMachineService,
    WorkloadClientGetter,
    extension_drives,
)
from fleet.extension.wire import (
    HOOKS_API_VERSION,
    REQUEST_TYPES,
    RESPONSE_TYPES,
    Hook,
    ResponseBase,
    describe_validation_error,
)
from fleet.extension.workload import SecretWorkloadClients
from fleet.kube import KubeClient, KubeError
from fleet.listen import start_site

log = logging.getLogger(__name__)

DEFAULT_PORT = 9443
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024  # a request carries ~6 objects, each < 1.5 MB in etcd
DEFAULT_TIMEOUT_SECONDS = 10.0
_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
                 "h": 3600.0}


def parse_go_duration(text: str | None) -> float | None:
    """Seconds in a Go ``time.Duration`` string such as ``10s`` or ``1m30s``; None if not one."""
    if not text:
        return None
    pos, total = 0, 0.0
    for m in _GO_DURATION.finditer(text):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    return total if pos == len(text) and pos > 0 else None


@dataclass(frozen=True, slots=True)
class _Route:
    hook: Hook
    timeout_seconds: float


def _routes(prefix: str) -> dict[str, _Route]:
    routes = {hook_path(Hook.DISCOVERY, prefix=prefix): _Route(Hook.DISCOVERY, 10.0)}
    for h in HANDLERS:
        routes[hook_path(h.hook, h.name, prefix)] = _Route(h.hook, float(h.timeout_seconds))
    return routes


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(body, separators=(",", ":")),
                        content_type="application/json")


def _failure(hook: Hook | None, message: str, status: int = 200) -> web.Response:
    if hook is None:
        return _json({"apiVersion": HOOKS_API_VERSION, "status": "Failure", "message": message},
                     status)
    return _json(RESPONSE_TYPES[hook].failure(message).to_wire(), status)


def _subject(payload: Any) -> str:
    """Namespace/name of the Machine(Set) a request is about, for logs."""
    try:
        objs = payload.get("desired") or {}
        obj = objs.get("machine") or objs.get("machineSet") or {}
        meta = obj.get("metadata") or {}
        return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    except AttributeError:
        return "?"


def build_app(handlers: ExtensionHandlers, *, path_prefix: str = "",
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> web.Application:
    """The aiohttp application (no listener): usable with aiohttp's test client too."""
    routes = _routes(path_prefix)
    served = ", ".join(sorted(routes))

    async def dispatch(request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        route = routes.get(path)
        if route is None:
            return _failure(None, f"no hook handler at {path!r}; this extension serves {served}",
                            404)
        hook = route.hook
        if request.method != "POST":
            return _failure(hook, f"{request.method} not allowed; hooks are called with POST",
                            405)
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _failure(hook, f"request body larger than {max_body_bytes} bytes", 413)
        try:
            payload = json.loads(raw) if raw.strip() else {}
        except (ValueError, RecursionError) as e:
            return _failure(hook, f"request body is not JSON: {e}"[:500])
        req_type = REQUEST_TYPES[hook]
        try:
            req = req_type.model_validate(payload)
        except ValidationError as e:
            return _failure(hook, f"invalid {req_type.KIND}: {describe_validation_error(e)}")
        except RecursionError:
            return _failure(hook, f"invalid {req_type.KIND}: nested too deeply")
        budget = parse_go_duration(request.query.get("timeout")) or route.timeout_seconds
        budget = max(0.5, 0.8 * budget)
        started = time.monotonic()
        try:
            with anyio.fail_after(budget):
                resp: ResponseBase = await handlers.handle(hook, req)
        except TimeoutError:
            resp = RESPONSE_TYPES[hook].failure(f"{hook} did not finish within {budget:.1f}s")
        except KubeError as e:
            resp = RESPONSE_TYPES[hook].failure(f"{hook}: Kubernetes API error: {e}"[:1000])
        except Exception as e:  # answer, log the trace here, never send it
            log.exception("%s handler failed", hook)
            resp = RESPONSE_TYPES[hook].failure(f"{hook}: internal error ({type(e).__name__})")
        if hook is not Hook.DISCOVERY:
            log.info("%s %s -> %s %s (%.0f ms)", hook, _subject(payload), resp.status,
                     resp.message, (time.monotonic() - started) * 1000)
        return _json(resp.to_wire())

    app = web.Application(client_max_size=max_body_bytes)
    app.router.add_route("*", "/{tail:.*}", dispatch)
    return app


@dataclass
class ExtensionServer:
    """A running listener. ``url`` is the base CAPI's ExtensionConfig would point at."""

    runner: web.AppRunner
    tls: ReloadingServerTLS
    host: str
    port: int
    path_prefix: str = ""

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"https://{host}:{self.port}{self.path_prefix}"

    @property
    def discovery_url(self) -> str:
        return f"{self.url}{DISCOVERY_PATH}"

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_extension_server(
    handlers: ExtensionHandlers, *, cert_file: str, key_file: str, host: str = "0.0.0.0",
    port: int = DEFAULT_PORT, path_prefix: str = "",
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> ExtensionServer:
    """Start the HTTPS listener (port 0 picks a free one); ``await server.close()`` stops it.

    Raises ``ssl.SSLError``/``OSError`` when the certificate cannot be loaded: a server
    without a certificate must not pretend to be up.
    """
    tls = ReloadingServerTLS(cert_file, key_file)
    app = build_app(handlers, path_prefix=path_prefix, max_body_bytes=max_body_bytes)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=tls.context)
        await start_site(site, what="runtime extension", setting="extension.port",
                         host=host, port=port)
        bound = port
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            bound = int(sockets[0].getsockname()[1])
    except BaseException:
        await runner.cleanup()
        raise
    log.info("runtime extension serving on https://%s:%d%s", host, bound, path_prefix)
    return ExtensionServer(runner=runner, tls=tls, host=host, port=bound,
                           path_prefix=path_prefix)


@asynccontextmanager
async def running_extension_server(handlers: ExtensionHandlers, **kwargs: Any,
                                   ) -> AsyncIterator[ExtensionServer]:
    server = await start_extension_server(handlers, **kwargs)
    try:
        yield server
    finally:
        await server.close()


async def serve_extension(handlers: ExtensionHandlers, *,
                          on_serving: Callable[[], None] | None = None, **kwargs: Any) -> None:
    """Serve until cancelled (the controller runs this in its task group).
    ``on_serving`` is called once the certificate is loaded and the port listens."""
    async with running_extension_server(handlers, **kwargs):
        if on_serving is not None:
            on_serving()
        await anyio.sleep_forever()


def handlers_from_config(config: FleetConfig, *, mgmt: KubeClient,
                         workload_client: WorkloadClientGetter | None,
                         artifacts: ArtifactResolver | None = None,
                         tracer: Tracer | None = None,
                         drives: ExtensionDrives | None = None) -> ExtensionHandlers:
    """The hooks as the fleet config says: mode, download policy (digest manifest
    included), per-cluster settings. ``artifacts`` lets a caller share its resolver
    (and manifest cache); by default one is made from ``config.download``. ``drives``:
    which clusters the extension path drives; by default
    :func:`~fleet.extension.update.extension_drives` on ``mgmt``'s ExtensionConfigs.

    ``mgmt`` is also the client UpdateMachine writes NodePlans with: pass the replica's
    fenced client (:meth:`fleet.kube.KubeClient.fenced`), as the controller does."""
    return ExtensionHandlers(
        update=UpdateMachineService(
            mgmt=mgmt, workload_client=workload_client,
            artifacts=artifacts or ArtifactResolver(config.download),
            cluster_settings=config.for_cluster, tracer=tracer,
            node_policy=config.agent.node_policy(),
            policy_hold=policy_hold_from_config(config, mgmt),
            drives=drives if drives is not None else extension_drives(
                mgmt, config.extension.mode, own_endpoint(config.extension)),
        ),
        mode=config.extension.mode,
    )


async def serve_configured_extension(config: FleetConfig, *, mgmt: KubeClient,
                                     workload_client: WorkloadClientGetter | None = None,
                                     artifacts: ArtifactResolver | None = None,
                                     tracer: Tracer | None = None,
                                     host: str = "0.0.0.0",
                                     on_serving: Callable[[], None] | None = None) -> None:
    """Serve the extension per ``config.extension`` until cancelled; returns at once
    when it is not enabled.

    Without ``workload_client``, workload clusters are reached through their kubeconfig
    Secrets (:class:`SecretWorkloadClients`), which works on every replica; the leader's
    cluster registry exists only on the leader. ``mgmt``: the replica's fenced client
    (UpdateMachine's NodePlan writes are fenced like the controller's).
    """
    ext = config.extension
    if not ext.enabled:
        return
    if not ext.cert_file or not ext.key_file:  # the config model already refuses this
        raise ValueError("extension.certFile and extension.keyFile are required")
    own: SecretWorkloadClients | None = None
    if workload_client is None:
        own = SecretWorkloadClients(
            mgmt, secret_name=lambda ns, name: config.for_cluster(ns, name).kubeconfig_secret,
            allow_file_credentials=config.clusters.kubeconfig_secrets.allows_files)
        workload_client = own
    try:
        await serve_extension(
            handlers_from_config(config, mgmt=mgmt, workload_client=workload_client,
                                 artifacts=artifacts, tracer=tracer),
            cert_file=ext.cert_file, key_file=ext.key_file, host=host, port=ext.port,
            on_serving=on_serving)
    finally:
        if own is not None:
            with anyio.CancelScope(shield=True):
                await own.close()
