"""The HTTPS endpoint: routes, well-formed failures, fuzzing, TLS only, certificate reload.

No API server here: UpdateMachine is either not wired or wired to a stub service.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from aiohttp.test_utils import TestClient, TestServer
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.extension import ExtensionHandlers, build_app, start_extension_server
from fleet.extension.catalog import DISCOVERY_PATH, HANDLER_BY_HOOK, hook_path
from fleet.extension.selfsigned import make_cert_pair
from fleet.extension.server import parse_go_duration
from fleet.extension.wire import Hook, UpdateMachineRequest, UpdateMachineResponse

pytestmark = pytest.mark.anyio

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hooks"
UPDATE_PATH = hook_path(Hook.UPDATE_MACHINE, HANDLER_BY_HOOK[Hook.UPDATE_MACHINE].name)
MS_PATH = hook_path(Hook.CAN_UPDATE_MACHINE_SET,
                    HANDLER_BY_HOOK[Hook.CAN_UPDATE_MACHINE_SET].name)
M_PATH = hook_path(Hook.CAN_UPDATE_MACHINE, HANDLER_BY_HOOK[Hook.CAN_UPDATE_MACHINE].name)
ALL_PATHS = [DISCOVERY_PATH, M_PATH, MS_PATH, UPDATE_PATH]


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


class ExplodingUpdate:
    """Stands in for UpdateMachineService: raises, or sleeps past the deadline."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    async def handle(self, req: UpdateMachineRequest) -> UpdateMachineResponse:
        if self.mode == "sleep":
            await anyio.sleep(30)
        raise RuntimeError("secret internal detail\nTraceback (most recent call last)")


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    app = build_app(ExtensionHandlers(), max_body_bytes=64 * 1024)
    async with TestClient(TestServer(app)) as c:
        yield c


async def post(c: TestClient[Any, Any], path: str, body: Any) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with c.post(path, data=data) as r:
        assert r.content_type == "application/json"
        return r.status, await r.json()


async def test_discovery_golden(client: TestClient[Any, Any]) -> None:
    status, body = await post(client, DISCOVERY_PATH + "?timeout=10s",
                              fixture("discovery-request.json"))
    assert status == 200
    assert body == fixture("discovery-response.json")
    # What CAPI validates in a discovery answer (defaultAndValidateDiscoveryResponse).
    for h in body["handlers"]:
        assert 0 <= h["timeoutSeconds"] <= 30 and h["failurePolicy"] in ("Fail", "Ignore")
        assert h["name"].replace("-", "").isalnum() and "." not in h["name"]


async def test_can_update_machine_set_over_http(client: TestClient[Any, Any]) -> None:
    status, body = await post(client, MS_PATH + "?timeout=5s",
                              fixture("canupdatemachineset-request-version.json"))
    assert status == 200
    assert body == fixture("canupdatemachineset-response-version.json")
    # CAPI lowercases the handler name and path.Join drops a trailing slash; be tolerant.
    status, body = await post(client, MS_PATH + "/",
                              fixture("canupdatemachineset-request-version.json"))
    assert status == 200 and body["status"] == "Success"


@pytest.mark.parametrize("raw, needle", [
    (b"{not json", "not JSON"),
    (b"[1, 2]", "invalid CanUpdateMachineRequest"),
    (b'{"current": {}, "desired": {}}', "machine"),
    (b'{"kind": "UpdateMachineRequest"}', "kind"),
    (b"\xff\xfe", "not JSON"),
    (b"[" * 30000 + b"]" * 30000, "not JSON"),
])
async def test_malformed_bodies_get_a_failure_answer(client: TestClient[Any, Any], raw: bytes,
                                                     needle: str) -> None:
    status, body = await post(client, M_PATH, raw)
    assert status == 200
    assert body["status"] == "Failure" and body["kind"] == "CanUpdateMachineResponse"
    assert needle in body["message"]


async def test_unknown_path_wrong_method_too_large(client: TestClient[Any, Any]) -> None:
    status, body = await post(client, "/hooks.runtime.cluster.x-k8s.io/v1alpha1/nope/x", {})
    assert status == 404 and body["status"] == "Failure" and "/updatemachine/" in body["message"]
    async with client.get(UPDATE_PATH) as r:
        assert r.status == 405
        body = await r.json()
        assert body["status"] == "Failure" and body["kind"] == "UpdateMachineResponse"
        assert body["retryAfterSeconds"] == 0
    status, body = await post(client, UPDATE_PATH, b" " * (65 * 1024))
    assert status == 413 and body["status"] == "Failure" and "larger than" in body["message"]


async def test_update_machine_unwired_is_a_failure(client: TestClient[Any, Any]) -> None:
    status, body = await post(client, UPDATE_PATH, fixture("updatemachine-request.json"))
    assert status == 200 and body["status"] == "Failure"
    assert body["retryAfterSeconds"] == 0 and "not wired" in body["message"]


async def test_handler_errors_never_leak_a_trace() -> None:
    h = ExtensionHandlers(update=ExplodingUpdate("raise"))  # type: ignore[arg-type]
    async with TestClient(TestServer(build_app(h))) as c:
        status, body = await post(c, UPDATE_PATH, fixture("updatemachine-request.json"))
    assert status == 200 and body["status"] == "Failure"
    assert "RuntimeError" in body["message"]
    assert "secret" not in body["message"] and "Traceback" not in body["message"]


async def test_handler_deadline_comes_from_capis_timeout_query() -> None:
    h = ExtensionHandlers(update=ExplodingUpdate("sleep"))  # type: ignore[arg-type]
    async with TestClient(TestServer(build_app(h))) as c:
        with anyio.fail_after(5):
            status, body = await post(c, UPDATE_PATH + "?timeout=500ms",
                                      fixture("updatemachine-request.json"))
    assert status == 200 and body["status"] == "Failure" and "did not finish" in body["message"]


async def test_mode_never_declines_everything() -> None:
    h = ExtensionHandlers(mode="never")  # type: ignore[arg-type]
    async with TestClient(TestServer(build_app(h))) as c:
        _, body = await post(c, MS_PATH, fixture("canupdatemachineset-request-version.json"))
        assert body["status"] == "Success" and "machineSetPatch" not in body
        assert "extension.mode=never" in body["message"]
        _, body = await post(c, UPDATE_PATH, fixture("updatemachine-request.json"))
        assert body["status"] == "Failure"


def test_parse_go_duration() -> None:
    assert parse_go_duration("10s") == 10
    assert parse_go_duration("1m30s") == 90
    assert parse_go_duration("500ms") == 0.5
    assert parse_go_duration("1.5h") == 5400
    for bad in ("", "10", "s", "10x", "1m 2s", None):
        assert parse_go_duration(bad) is None


# -- fuzzing: every input gets a well-formed answer ----------------------------------------

@pytest.fixture(scope="module")
def portal_client() -> Iterator[tuple[BlockingPortal, TestClient[Any, Any]]]:
    async def make() -> TestClient[Any, Any]:
        c: TestClient[Any, Any] = TestClient(TestServer(build_app(ExtensionHandlers(),
                                                                  max_body_bytes=256 * 1024)))
        await c.start_server()
        return c

    with start_blocking_portal("asyncio") as portal:
        c = portal.call(make)
        try:
            yield portal, c
        finally:
            portal.call(c.close)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children,
                                                                       max_size=4),
    max_leaves=20,
)


def _mutations() -> st.SearchStrategy[Any]:
    bases = [fixture(n) for n in ("canupdatemachine-request-version.json",
                                  "canupdatemachineset-request-version.json",
                                  "updatemachine-request.json", "discovery-request.json")]

    def mutate(base: Any, path_picks: list[int], value: Any) -> Any:
        doc = json.loads(json.dumps(base))
        node = doc
        for pick in path_picks:
            if isinstance(node, dict) and node:
                keys = sorted(node)
                key = keys[pick % len(keys)]
                if not isinstance(node[key], dict | list) or pick % 3 == 0:
                    node[key] = value
                    return doc
                node = node[key]
            elif isinstance(node, list) and node:
                node[pick % len(node)] = value
                return doc
        return doc

    return st.builds(mutate, st.sampled_from(bases), st.lists(st.integers(0, 50), max_size=6),
                     json_values)


bodies = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    _mutations().map(lambda v: json.dumps(v).encode()),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from([*ALL_PATHS, "/", "/hooks.runtime.cluster.x-k8s.io/v1alpha1/x"]),
       body=bodies, query=st.sampled_from(["", "?timeout=10s", "?timeout=bogus"]))
def test_fuzz_every_request_gets_a_well_formed_response(
        portal_client: tuple[BlockingPortal, TestClient[Any, Any]], path: str, body: bytes,
        query: str) -> None:
    portal, c = portal_client

    async def call() -> tuple[int, str, str]:
        async with c.post(path + query, data=body) as r:
            return r.status, r.content_type, await r.text()

    status, ctype, text = portal.call(call)
    assert status in (200, 404, 405, 413), text
    assert ctype == "application/json"
    doc = json.loads(text)
    assert doc["status"] in ("Success", "Failure")
    assert doc["apiVersion"] == "hooks.runtime.cluster.x-k8s.io/v1alpha1"
    if doc["status"] == "Failure":
        assert isinstance(doc["message"], str) and doc["message"]
        assert "Traceback" not in doc["message"]
        # Odd shapes are handled by the decisions themselves, not by the last-resort catch.
        assert "internal error" not in doc["message"], doc["message"]
    if path == UPDATE_PATH:
        assert isinstance(doc["retryAfterSeconds"], int)


# -- the real listener: TLS only, certificates follow their files ---------------------------

@pytest.fixture
def certs(tmp_path: Path) -> tuple[Path, Path, Path]:
    return make_cert_pair(["localhost"]).write(tmp_path)


async def test_tls_required_plain_http_refused(certs: tuple[Path, Path, Path]) -> None:
    cert, key, ca = certs
    server = await start_extension_server(ExtensionHandlers(), cert_file=str(cert),
                                          key_file=str(key), host="127.0.0.1", port=0)
    try:
        ctx = ssl.create_default_context(cafile=str(ca))
        async with aiohttp.ClientSession() as s:
            async with s.post(server.discovery_url, json={}, ssl=ctx) as r:
                assert r.status == 200 and (await r.json())["status"] == "Success"
            with pytest.raises(aiohttp.ClientError):
                async with s.post(server.discovery_url.replace("https://", "http://"),
                                  json={}) as r:
                    await r.read()
            # An untrusting client fails the handshake too (the server is not anonymous).
            with pytest.raises(aiohttp.ClientConnectorError):
                async with s.post(server.discovery_url, json={},
                                  ssl=ssl.create_default_context()) as r:
                    await r.read()
    finally:
        await server.close()


async def _served_cert(port: int) -> str:
    return await anyio.to_thread.run_sync(ssl.get_server_certificate, ("127.0.0.1", port))


def _same_pem(a: str | bytes, b: str | bytes) -> bool:
    def norm(x: str | bytes) -> bytes:
        raw = x.encode() if isinstance(x, str) else x
        return ssl.PEM_cert_to_DER_cert(raw.decode())
    return norm(a) == norm(b)


async def test_certificate_reloaded_for_new_connections(tmp_path: Path) -> None:
    first = make_cert_pair(["localhost"], common_name="first")
    cert, key, _ = first.write(tmp_path)
    server = await start_extension_server(ExtensionHandlers(), cert_file=str(cert),
                                          key_file=str(key), host="127.0.0.1", port=0)
    try:
        assert _same_pem(await _served_cert(server.port), first.cert_pem)
        # A half-written rotation (new cert, old key) keeps the old certificate in use.
        second = make_cert_pair(["localhost"], common_name="second")
        cert.write_bytes(second.cert_pem)
        assert _same_pem(await _served_cert(server.port), first.cert_pem)
        assert server.tls.last_error is not None
        key.write_bytes(second.key_pem)
        assert _same_pem(await _served_cert(server.port), second.cert_pem)
        assert server.tls.reloads == 1 and server.tls.last_error is None
        # And CAPI (trusting the new CA only) can talk to it.
        (tmp_path / "ca2.crt").write_bytes(second.ca_pem)
        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca2.crt"))
        async with aiohttp.ClientSession() as s, \
                s.post(server.discovery_url, json={}, ssl=ctx) as r:
            assert r.status == 200
        # A symlink swap, as a Secret volume does it.
        third = make_cert_pair(["localhost"], common_name="third")
        third.write(tmp_path / "v3")
        (tmp_path / "tls.crt").unlink()
        (tmp_path / "tls.key").unlink()
        (tmp_path / "tls.crt").symlink_to(tmp_path / "v3" / "tls.crt")
        (tmp_path / "tls.key").symlink_to(tmp_path / "v3" / "tls.key")
        assert _same_pem(await _served_cert(server.port), third.cert_pem)
    finally:
        await server.close()


async def test_server_refuses_to_start_without_a_usable_certificate(tmp_path: Path) -> None:
    a = make_cert_pair()
    b = make_cert_pair()
    (tmp_path / "tls.crt").write_bytes(a.cert_pem)
    (tmp_path / "tls.key").write_bytes(b.key_pem)
    with pytest.raises(ssl.SSLError):
        await start_extension_server(ExtensionHandlers(), cert_file=str(tmp_path / "tls.crt"),
                                     key_file=str(tmp_path / "tls.key"), port=0)
    with pytest.raises(OSError):
        await start_extension_server(ExtensionHandlers(), cert_file=str(tmp_path / "nope"),
                                     key_file=str(tmp_path / "tls.key"), port=0)
