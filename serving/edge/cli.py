"""`python -m serving.edge --listen HOST:PORT --upstream URL --ingest-url URL --endpoint-id ID`.

The ingest token comes from the environment (`TAILGUARD_EDGE_INGEST_TOKEN`), never from a flag:
a command line is visible to every user of the machine (`ps`). SIGTERM or SIGINT stops the proxy:
running requests may finish for `--shutdown-grace-s`, then what was recorded is sent.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from urllib.parse import urlsplit

from serving.edge import TOKEN_ENV
from serving.edge.proxy import EdgeProxy, EdgeProxySettings
from serving.edge.shipper import IngestTarget


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"--listen must be HOST:PORT, not {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _http_url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"expected an http(s) URL, not {text!r}")
    return text


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m serving.edge",
        description="Measure every generation request at the endpoint's edge (TTFT, status) and post "
        f"the records to the portal's SLA ingest. The token is read from ${TOKEN_ENV}.",
    )
    parser.add_argument("--listen", required=True, type=_listen, help="HOST:PORT clients call")
    parser.add_argument("--upstream", required=True, type=_http_url, help="the engine's or router's base URL")
    parser.add_argument(
        "--ingest-url", required=True, type=_http_url, help="the portal's edge ingest, …/sla/edge/"
    )
    parser.add_argument("--endpoint-id", required=True, help="the portal's id of this endpoint")
    parser.add_argument("--max-body-bytes", type=int, default=16 * 2**20)
    parser.add_argument(
        "--max-buffered-records",
        type=int,
        default=100_000,
        help="records held while the portal is unreachable; beyond it the oldest are dropped (a gap)",
    )
    parser.add_argument("--flush-interval-s", type=_positive, default=5.0)
    parser.add_argument("--upstream-read-timeout-s", type=_positive, default=600.0)
    parser.add_argument("--shutdown-grace-s", type=_positive, default=10.0)
    parser.add_argument("--drain-timeout-s", type=_positive, default=10.0)
    parser.add_argument("--record-log", type=Path, help="append every measured request here (JSONL)")
    return parser


async def _run(settings: EdgeProxySettings) -> int:
    proxy = EdgeProxy(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await proxy.start()
    print(f"[tailguard-edge] listening on {settings.listen_host}:{proxy.port}", flush=True)
    await stop.wait()
    delivered = await proxy.stop()
    stats = proxy.stats()
    print(
        f"[tailguard-edge] stopped: {stats.delivered} records delivered, {stats.dropped} dropped, "
        f"{stats.rejected} refused by the portal, {stats.buffered} not delivered",
        flush=True,
    )
    return 0 if delivered else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        print(
            f"python -m serving.edge: set ${TOKEN_ENV} to the portal's SLA_EDGE_INGEST_TOKEN", file=sys.stderr
        )
        return 2
    if args.max_buffered_records < 2 or args.max_body_bytes < 1:
        print(
            "python -m serving.edge: --max-buffered-records >= 2 and --max-body-bytes >= 1", file=sys.stderr
        )
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, port = args.listen
    settings = EdgeProxySettings(
        listen_host=host,
        listen_port=port,
        upstream_url=args.upstream,
        ingest=IngestTarget(url=args.ingest_url, endpoint_id=args.endpoint_id, token=token),
        max_body_bytes=args.max_body_bytes,
        max_buffered_records=args.max_buffered_records,
        flush_interval_s=args.flush_interval_s,
        upstream_read_timeout_s=args.upstream_read_timeout_s,
        shutdown_grace_s=args.shutdown_grace_s,
        drain_timeout_s=args.drain_timeout_s,
        record_log=args.record_log,
    )
    return asyncio.run(_run(settings))
