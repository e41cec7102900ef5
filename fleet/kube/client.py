"""KubeClient: one API server, one kubernetes-asyncio ApiClient, plain-dict objects."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio
import yaml
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

from fleet.kube.errors import KubeError, NotFoundError, UnreachableError, from_status
from fleet.kube.resources import Resource

log = logging.getLogger(__name__)

KubeObject = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

_RESPONSE_TYPES = {code: "object" for code in (200, 201, 202)}


@dataclass(frozen=True, slots=True)
class ObjectList:
    items: list[KubeObject]
    resource_version: str


class KubeClient:
    """A client for one API server.

    Build it inside the running event loop (``await KubeClient.from_kubeconfig(...)``)
    and close it (``await client.close()`` or ``async with``). It never touches
    kubernetes-asyncio's global default configuration.
    """

    def __init__(self, api: k8s_client.ApiClient, *, name: str = "cluster") -> None:
        self._api = api
        self.name = name

    # -- construction ------------------------------------------------------------
    @classmethod
    async def from_kubeconfig(cls, kubeconfig: Mapping[str, Any], *, name: str = "cluster",
                              context: str | None = None) -> KubeClient:
        cfg = k8s_client.Configuration()
        await k8s_config.load_kube_config_from_dict(
            dict(kubeconfig), context=context, client_configuration=cfg, temp_file_path=None
        )
        return cls(k8s_client.ApiClient(configuration=cfg), name=name)

    @classmethod
    async def from_kubeconfig_file(cls, path: str, *, name: str = "cluster",
                                   context: str | None = None) -> KubeClient:
        data = yaml.safe_load(await anyio.Path(path).read_text(encoding="utf-8"))
        return await cls.from_kubeconfig(data, name=name, context=context)

    @classmethod
    def in_cluster(cls, *, name: str = "management") -> KubeClient:
        cfg = k8s_client.Configuration()
        k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return cls(k8s_client.ApiClient(configuration=cfg), name=name)

    async def close(self) -> None:
        await self._api.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def host(self) -> str:
        return str(self._api.configuration.host)

    # -- raw request -------------------------------------------------------------
    async def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                      body: Any = None, content_type: str = "application/json",
                      timeout: float | None = 30.0) -> Any:
        query_params = [(k, _query_value(v)) for k, v in (query or {}).items() if v is not None]
        try:
            return await self._api.call_api(
                path, method,
                query_params=query_params,
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                response_types_map=_RESPONSE_TYPES,
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _preload_content=True,
                _request_timeout=timeout,
            )
        except ApiException as e:
            raise from_status(e.status or 0, e.body, e.headers) from None
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise UnreachableError(f"{self.name}: {method} {path}: {e!r}") from e

    async def open_stream(self, path: str, *, query: Mapping[str, Any],
                          read_timeout: float) -> aiohttp.ClientResponse:
        """Open a streaming GET (a watch); the caller reads and releases the response."""
        query_params = [(k, _query_value(v)) for k, v in query.items() if v is not None]
        try:
            resp = await self._api.call_api(
                path, "GET",
                query_params=query_params,
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _preload_content=False,
                _request_timeout=aiohttp.ClientTimeout(
                    connect=10, sock_connect=10, sock_read=read_timeout
                ),
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise UnreachableError(f"{self.name}: watch {path}: {e!r}") from e
        if not 200 <= resp.status <= 299:
            body = await resp.read()
            resp.release()
            raise from_status(resp.status, body, resp.headers)
        return resp  # type: ignore[no-any-return]

    # -- typed verbs -------------------------------------------------------------
    async def get(self, res: Resource, name: str, namespace: str | None = None,
                  *, subresource: str | None = None) -> KubeObject:
        return await self.request("GET", res.path(namespace, name, subresource))  # type: ignore[no-any-return]

    async def get_or_none(self, res: Resource, name: str,
                          namespace: str | None = None) -> KubeObject | None:
        try:
            return await self.get(res, name, namespace)
        except NotFoundError:
            return None

    async def list(self, res: Resource, namespace: str | None = None, *,
                   label_selector: str | None = None, field_selector: str | None = None,
                   page_size: int = 500) -> ObjectList:
        """List all pages; the result's resource_version is where a watch continues."""
        items: list[KubeObject] = []
        cont: str | None = None
        rv = ""
        while True:
            page = await self.request("GET", res.path(namespace), query={
                "labelSelector": label_selector, "fieldSelector": field_selector,
                "limit": page_size, "continue": cont,
            })
            for item in page.get("items") or []:
                # list items omit kind/apiVersion; restore them so objects are self-describing
                item.setdefault("kind", res.kind)
                item.setdefault("apiVersion", res.api_version)
                items.append(item)
            meta = page.get("metadata") or {}
            rv = meta.get("resourceVersion") or rv
            cont = meta.get("continue")
            if not cont:
                return ObjectList(items=items, resource_version=rv)

    async def create(self, res: Resource, body: KubeObject,
                     namespace: str | None = None) -> KubeObject:
        body = {"apiVersion": res.api_version, "kind": res.kind, **body}
        ns = namespace or (body.get("metadata") or {}).get("namespace")
        return await self.request("POST", res.path(ns if res.namespaced else None), body=body)  # type: ignore[no-any-return]

    async def create_subresource(self, res: Resource, name: str, subresource: str,
                                 body: KubeObject, namespace: str | None = None) -> Any:
        return await self.request("POST", res.path(namespace, name, subresource), body=body)

    async def patch(self, res: Resource, name: str, patch: Any, namespace: str | None = None,
                    *, content_type: str = MERGE_PATCH,
                    subresource: str | None = None) -> KubeObject:
        """Patch with an explicit content type (never guessed from the body's shape)."""
        return await self.request(  # type: ignore[no-any-return]
            "PATCH", res.path(namespace, name, subresource), body=patch,
            content_type=content_type,
        )

    async def replace(self, res: Resource, body: KubeObject, *,
                      subresource: str | None = None) -> KubeObject:
        meta = body["metadata"]
        return await self.request(  # type: ignore[no-any-return]
            "PUT", res.path(meta.get("namespace"), meta["name"], subresource), body=body
        )

    async def delete(self, res: Resource, name: str, namespace: str | None = None, *,
                     uid: str | None = None, resource_version: str | None = None,
                     propagation: str | None = None) -> Any:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        pre: dict[str, str] = {}
        if uid:
            pre["uid"] = uid
        if resource_version:
            pre["resourceVersion"] = resource_version
        if pre:
            body["preconditions"] = pre
        if propagation:
            body["propagationPolicy"] = propagation
        return await self.request("DELETE", res.path(namespace, name), body=body)

    async def server_version(self) -> dict[str, Any]:
        return await self.request("GET", "/version")  # type: ignore[no-any-return]

    async def watch_lines(self, res: Resource, namespace: str | None, *,
                          resource_version: str, label_selector: str | None,
                          field_selector: str | None, timeout_seconds: int,
                          read_timeout: float) -> AsyncIterator[dict[str, Any]]:
        """One watch request, decoded; ends when the server closes the stream."""
        resp = await self.open_stream(res.path(namespace), query={
            "watch": "true", "allowWatchBookmarks": "true",
            "resourceVersion": resource_version, "labelSelector": label_selector,
            "fieldSelector": field_selector, "timeoutSeconds": timeout_seconds,
        }, read_timeout=read_timeout)
        try:
            while True:
                try:
                    line = await resp.content.readline()
                except (aiohttp.ClientError, TimeoutError, OSError) as e:
                    raise UnreachableError(f"{self.name}: watch {res}: {e!r}") from e
                if not line:
                    return
                line = line.strip()
                if line:
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError as e:
                        raise KubeError(f"{self.name}: undecodable watch line: {e}") from e
        finally:
            resp.release()


def _query_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)
