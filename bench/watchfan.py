"""The controller's Node-watch path alone: N watches over TLS reading the same events.

    .venv/bin/python bench/watchfan.py --clusters 1000 --rate 1 --seconds 30 \\
        [--json out.json] [--py-spy out.txt] [--fleet-root /tmp/other-checkout]

What ``churn.py`` measures without the rest of the world (no etcd, no kube-apiserver, no
Cluster API objects): a small HTTPS server in its own process stands in for the
workload clusters' API server. It answers a Node list (9 realistic ~14 KB Nodes,
``fleet.testing.kubesim.nodes.realistic_node``) and holds each Node watch open, and from
the start of the window patches one Node's annotation ``--rate`` times a second,
writing the very same watch line (one chunk, as a kube-apiserver flushes each event) to
every watch. The measured process is the controller's side of it, as the workload
cluster registry builds it (``fleet.world.clusters``): one light-transport ``KubeClient`` per
cluster (its own TLS connection), a ``Reflector`` with the Node subset decoder feeding a
``RecordCache`` of NodeRecords, glibc's fixed mmap threshold and ``gc.freeze()`` after
start-up. It samples its own CPU time, event-loop lag (a 20 ms sleep's overshoot), GC
pauses, and when each event reached the first and the last of the N caches.

For finding where the time goes and comparing changes to the HTTP/watch path quickly;
the figures that count are ``churn.py``'s (the real API server shares the two cores).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
NODES = [*(f"shared-cp-{i}" for i in range(3)), *(f"shared-md-{i}" for i in range(6))]
CHURN_KEY = "bench.k0s-fleet.io/churn"


# -- the stand-in API server --------------------------------------------------------------

def _write(path: str, text: str) -> None:
    Path(path).write_text(text)


def _read(path: str) -> str:
    return Path(path).read_text()


def server_main(cert_dir: str, port_file: str, rate: float, log_file: str,
                go_framing: bool) -> None:
    sys.path.insert(0, str(REPO))
    from fleet.testing.kubesim.nodes import realistic_node  # noqa: PLC0415

    nodes = [realistic_node(n, "v1.31.2+k0s.0", control_plane=n.startswith("shared-cp"),
                            index=i) for i, n in enumerate(NODES)]
    rv = 1000
    for node in nodes:
        rv += 1
        node["metadata"]["resourceVersion"] = str(rv)
    watches: set[asyncio.StreamWriter] = set()
    sent: list[tuple[float, int]] = []
    churning = asyncio.Event()
    stopping = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                target = head.split(b" ", 2)[1].decode()
                if "watch=true" in target:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Transfer-Encoding: chunked\r\n\r\n")
                    watches.add(writer)
                    try:
                        await reader.read()  # until the client goes
                    finally:
                        watches.discard(writer)
                    return
                body = json.dumps({"kind": "NodeList", "apiVersion": "v1",
                                   "metadata": {"resourceVersion": str(rv)},
                                   "items": nodes}, separators=(",", ":")).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(body) + body)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def churn() -> None:
        nonlocal rv
        await churning.wait()
        start = time.monotonic()
        k = 0
        while not stopping.is_set():
            due = start + k / rate
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            node = nodes[k % len(nodes)]
            rv += 1
            node["metadata"]["resourceVersion"] = str(rv)
            node["metadata"]["annotations"][CHURN_KEY] = f"{k}-{time.time():.3f}"
            line = json.dumps({"type": "MODIFIED", "object": node},
                              separators=(",", ":")).encode() + b"\n"
            chunk = b"%x\r\n" % len(line) + line + b"\r\n"
            sent.append((time.time(), rv))
            if go_framing:
                # As Go's net/http writes a chunk through its 4 KiB connection buffer:
                # header and the first bytes filling the buffer, the rest directly, the
                # chunk's CRLF at the flush: three TLS records, three socket writes.
                pieces = [chunk[:4096], chunk[4096:-2], chunk[-2:]]
                for w in list(watches):
                    for piece in pieces:
                        w.write(piece)
            else:
                for w in list(watches):
                    w.write(chunk)
            k += 1

    async def main() -> None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(f"{cert_dir}/server.crt", f"{cert_dir}/server.key")
        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx, backlog=4096)
        port = server.sockets[0].getsockname()[1]
        _write(port_file, str(port))
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, churning.set)
        loop.add_signal_handler(signal.SIGTERM, stopping.set)
        task = asyncio.create_task(churn())
        await stopping.wait()
        churning.set()
        await task
        _write(log_file, json.dumps({"sent": sent}))
        server.close()

    asyncio.run(main())


# -- the measured side: the controller's Node watches --------------------------------------

def client_main(fleet_root: str, kubeconfig_file: str, clusters: int, out: str) -> None:
    sys.path.insert(0, str(REPO))
    from bench.stats import record_gc_pauses  # noqa: PLC0415  (this checkout's bench)

    sys.path.insert(0, fleet_root)  # (and --fleet-root's fleet)
    from fleet.controllers.heap import fixed_mmap_threshold  # noqa: PLC0415

    fixed_mmap_threshold()
    gcs = record_gc_pauses()
    import anyio  # noqa: PLC0415

    anyio.run(_client, kubeconfig_file, clusters, out, gcs)


async def _client(kubeconfig_file: str, clusters: int, out: str,
                  gcs: list[tuple[float, int, float]]) -> None:
    import anyio  # noqa: PLC0415

    from fleet.kube import KubeClient  # noqa: PLC0415
    from fleet.kube.backoff import Backoff  # noqa: PLC0415
    from fleet.kube.resources import NODES as NODE_RES  # noqa: PLC0415
    from fleet.kube.watch import Reflector  # noqa: PLC0415
    from fleet.world.clusters import node_cache  # noqa: PLC0415
    from fleet.world.records import node_subset  # noqa: PLC0415

    kubeconfig = json.loads(await anyio.Path(kubeconfig_file).read_text())
    arrivals: dict[str, list[float]] = {}  # rv -> [first, last, count]
    lags: list[tuple[float, float]] = []
    cpu: list[tuple[float, float]] = []
    relists = anyio.CapacityLimiter(16)
    reflectors: list[Reflector] = []

    def listener_of(cache: Any) -> Any:
        async def on_event(event: Any) -> None:
            await cache.on_event(event)
            rv = event.object["metadata"]["resourceVersion"]
            now = time.time()
            seen = arrivals.get(rv)
            if seen is None:
                arrivals[rv] = [now, now, 1]
            else:
                seen[1] = now
                seen[2] += 1
        return on_event

    async def one(tg: Any) -> None:
        client = await KubeClient.for_many(kubeconfig, name=f"workload:{len(reflectors)}")
        cache = node_cache()
        r = Reflector(client, NODE_RES, listener=listener_of(cache), watch_timeout=3600,
                      spread=0.5, backoff=Backoff(initial=0.1, maximum=5.0),
                      keep_objects=False, relist_limiter=relists, decoder=node_subset)
        reflectors.append(r)
        tg.start_soon(r.run)

    async def loop_lag() -> None:
        while True:
            t = time.perf_counter()
            await anyio.sleep(0.02)
            lags.append((time.time(), time.perf_counter() - t - 0.02))

    page = os.sysconf("SC_PAGE_SIZE")

    async def sample_cpu() -> None:
        while True:
            rss = int(_read("/proc/self/statm").split()[1]) * page / 2**20
            cpu.append((time.time(), time.process_time(), rss))
            await anyio.sleep(0.5)

    async with anyio.create_task_group() as tg:
        for _ in range(clusters):
            await one(tg)
        for r in reflectors:
            await r.synced.wait()
        gc.collect()
        gc.freeze()
        await anyio.Path(out + ".ready").write_text("1")
        tg.start_soon(loop_lag)
        tg.start_soon(sample_cpu)
        with anyio.open_signal_receiver(signal.SIGTERM) as rx:
            async for _ in rx:
                break
        await anyio.Path(out).write_text(json.dumps({
            "lags": lags, "gcs": gcs, "cpu": cpu, "arrivals": arrivals,
            "fleet": str(Path(sys.modules["fleet"].__file__ or "").parent)}))
        tg.cancel_scope.cancel()


# -- the parent ----------------------------------------------------------------------------

def _ms(values: list[float]) -> dict[str, float]:
    sys.path.insert(0, str(REPO))
    from bench.stats import percentile  # noqa: PLC0415

    if not values:
        return {"n": 0}
    return {"n": len(values), "p50": round(percentile(values, 0.5) * 1000, 1),
            "p99": round(percentile(values, 0.99) * 1000, 1),
            "max": round(max(values) * 1000, 1)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from fleet.testing.kubesim.certs import make_serving_cert  # noqa: PLC0415

    work = Path(args.workdir or tempfile.mkdtemp(prefix="k0s-fleet-watchfan-"))
    work.mkdir(parents=True, exist_ok=True)
    cert = make_serving_cert(work / "certs")
    port_file, server_log = work / "port", work / "server.json"
    port_file.unlink(missing_ok=True)
    me = [sys.executable, __file__]
    server = subprocess.Popen([*me, "--server", str(work / "certs"), str(port_file),
                               str(args.rate), str(server_log),
                               "go" if args.go_framing else "whole"])
    client = None
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the stand-in server did not start")
            time.sleep(0.05)
        import base64  # noqa: PLC0415

        kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
                      "clusters": [{"name": "c", "cluster": {
                          "server": f"https://127.0.0.1:{port_file.read_text()}",
                          "certificate-authority-data":
                              base64.b64encode(cert.ca_pem).decode()}}],
                      "users": [{"name": "u", "user": {"token": "bench"}}],
                      "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}
        (work / "kubeconfig.json").write_text(json.dumps(kubeconfig))
        out = work / "client.json"
        Path(str(out) + ".ready").unlink(missing_ok=True)
        client = subprocess.Popen([*me, "--client", args.fleet_root,
                                   str(work / "kubeconfig.json"), str(args.clusters),
                                   str(out)], env={**os.environ, "PYTHONPATH": args.fleet_root})
        t0 = time.monotonic()
        while not Path(str(out) + ".ready").exists():
            if time.monotonic() - t0 > args.timeout or client.poll() is not None:
                raise RuntimeError("the watches did not start")
            time.sleep(0.1)
        started_s = round(time.monotonic() - t0, 1)
        time.sleep(args.settle_seconds)
        spy = None
        if args.py_spy:
            spy = subprocess.Popen([args.py_spy_bin, "record",
                                    "--nonblocking", "-r", "200", "-d",
                                    str(int(args.seconds)), "-f", args.py_spy_format,
                                    "-o", args.py_spy, "-p", str(client.pid)],
                                   stdout=subprocess.DEVNULL)
        start = time.time()
        server.send_signal(signal.SIGUSR1)
        time.sleep(args.seconds)
        server.send_signal(signal.SIGTERM)
        end = time.time()
        server.wait(30)
        time.sleep(args.after_seconds)
        if spy is not None:
            spy.wait(60)
        client.send_signal(signal.SIGTERM)
        client.wait(60)
        data = json.loads(out.read_text())
        sent = json.loads(server_log.read_text())["sent"]
    finally:
        for p in (server, client):
            if p is not None and p.poll() is None:
                p.kill()
    cpu = [c for c in data["cpu"] if start <= c[0] <= end]
    before = [c[2] for c in data["cpu"] if c[0] < start]
    lags = [lag for t, lag in data["lags"] if start <= t < end]
    gcs = [g for g in data["gcs"] if start <= g[0] < end]
    first, last, missing = [], [], 0
    caught_up = 0.0
    for t, rv in sent:
        seen = data["arrivals"].get(str(rv))
        if seen is None or seen[2] < args.clusters:
            missing += 1
            continue
        first.append(seen[0] - t)
        last.append(seen[1] - t)
        caught_up = max(caught_up, seen[1] - end)
    return {
        "clusters": args.clusters, "rate": args.rate, "seconds": args.seconds,
        "go_framing": args.go_framing,
        "events_per_s": round(len(sent) * args.clusters / (end - start)),
        "start_up_s": started_s,
        "cpu_percent": round(100 * (cpu[-1][1] - cpu[0][1]) / (cpu[-1][0] - cpu[0][0]), 1)
        if len(cpu) >= 2 else None,
        "cpu_us_per_event": round(1e6 * (cpu[-1][1] - cpu[0][1]) / (cpu[-1][0] - cpu[0][0])
                                  / (args.rate * args.clusters), 1) if len(cpu) >= 2 else None,
        "loop_lag_ms": _ms(lags),
        "rss_mib": {"before": round(before[-1], 1) if before else None,
                    "peak": round(max(c[2] for c in data["cpu"] if c[0] >= start), 1)},
        "gc": {"seconds": round(sum(g[2] for g in gcs), 3),
               "collections": [sum(1 for g in gcs if g[1] == k) for k in range(3)]},
        "to_first_ms": _ms(first), "to_all_ms": _ms(last),
        "events_not_everywhere": missing, "caught_up_after_end_s": round(caught_up, 2),
        "fleet": data["fleet"], "loadavg": os.getloadavg(),
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--server":
        server_main(sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5],
                    sys.argv[6] == "go")
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clusters", type=int, default=1000)
    p.add_argument("--rate", type=float, default=1.0, help="Node patches per second")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--settle-seconds", type=float, default=3.0)
    p.add_argument("--after-seconds", type=float, default=5.0)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--go-framing", action="store_true",
                   help="write each event as Go's net/http does: three TLS records")
    p.add_argument("--fleet-root", default=str(REPO))
    p.add_argument("--py-spy", help="py-spy record the measured process into this file")
    p.add_argument("--py-spy-format", default="raw")
    p.add_argument("--py-spy-bin", default=str(Path(sys.executable).parent / "py-spy"))
    p.add_argument("--workdir")
    p.add_argument("--json")
    args = p.parse_args()
    args.fleet_root = str(Path(args.fleet_root).resolve())
    result = run(args)
    sys.path.insert(0, str(REPO))
    from bench.stats import report  # noqa: PLC0415
    return report(result, args.json)


if __name__ == "__main__":
    sys.exit(main())
