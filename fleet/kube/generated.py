"""The ``generated`` transport: kubernetes-asyncio's ApiClient behind the Transport API."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException

from fleet.kube.errors import (
    UnreachableError,
    WatchIdleError,
    answer,
    from_status,
)

_RESPONSE_TYPES = {code: "object" for code in (200, 201, 202)}


class _Lines:
    def __init__(self, resp: aiohttp.ClientResponse, what: str) -> None:
        self._resp = resp
        self._what = what

    async def readline(self) -> bytes:
        try:
            return await self._resp.content.readline()
        except TimeoutError as e:  # aiohttp's read timeouts are TimeoutErrors too
            raise WatchIdleError(f"{self._what}: nothing read: {e!r}") from e
        except (aiohttp.ClientError, OSError) as e:
            raise UnreachableError(f"{self._what}: {e!r}") from e

    async def pour(self, sink: Callable[[bytes], None]) -> None:
        while line := await self.readline():
            sink(line)

    def release(self) -> None:
        self._resp.release()


class GeneratedTransport:
    """Never touches kubernetes-asyncio's global default configuration."""

    def __init__(self, api: k8s_client.ApiClient, *, name: str) -> None:
        self.api = api
        self.name = name

    @classmethod
    async def from_kubeconfig(cls, kubeconfig: Mapping[str, Any], *, name: str,
                              context: str | None = None) -> GeneratedTransport:
        cfg = k8s_client.Configuration()
        await k8s_config.load_kube_config_from_dict(
            dict(kubeconfig), context=context, client_configuration=cfg, temp_file_path=None
        )
        return cls(k8s_client.ApiClient(configuration=cfg), name=name)

    @classmethod
    def in_cluster(cls, *, name: str) -> GeneratedTransport:
        cfg = k8s_client.Configuration()
        k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        return cls(k8s_client.ApiClient(configuration=cfg), name=name)

    @property
    def host(self) -> str:
        return str(self.api.configuration.host)

    async def close(self) -> None:
        await self.api.close()

    async def call(self, method: str, path: str, *, query: Sequence[tuple[str, str]],
                   body: Any, content_type: str, timeout: float | None,
                   decode: Callable[[bytes], Any] | None = None) -> Any:
        if decode is not None:
            return await self._call_raw(method, path, query=query, body=body,
                                        content_type=content_type, timeout=timeout,
                                        decode=decode)
        try:
            return await self.api.call_api(
                path, method,
                query_params=list(query),
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

    async def _call_raw(self, method: str, path: str, *, query: Sequence[tuple[str, str]],
                        body: Any, content_type: str, timeout: float | None,
                        decode: Callable[[bytes], Any]) -> Any:
        """One request whose answer's body ``decode`` reads (not the generated models)."""
        try:
            resp = await self.api.call_api(
                path, method,
                query_params=list(query),
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _preload_content=False,
                _request_timeout=timeout,
            )
            try:
                data = await resp.read()
            finally:
                resp.release()
        except ApiException as e:
            raise from_status(e.status or 0, e.body, e.headers) from None
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise UnreachableError(f"{self.name}: {method} {path}: {e!r}") from e
        return answer(f"{self.name}: {method} {path}", resp.status, data, resp.headers, decode)

    async def stream(self, path: str, *, query: Sequence[tuple[str, str]],
                     read_timeout: float) -> _Lines:
        try:
            resp = await self.api.call_api(
                path, "GET",
                query_params=list(query),
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
        return _Lines(resp, f"{self.name}: watch {path}")
