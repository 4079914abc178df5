"""The client's reads wait for no one: the thread that runs a replay's event loop is scheduled
under the real-time FIFO policy where the host allows it.

Why: a load generator that shares its host's cores with the engine (this project's CPU hosts run
both on two cores) reads a streamed token only when the kernel next runs it. At the normal policy
the engine's busy threads kept a client waiting until the engine had streamed the whole response:
at one open stream our p95 TTFT read 113 ms where independent FIFO-scheduled raw-socket clients
read 14 ms and the engine's own TTFT was 11 ms, on an AVX512-BF16 host
(`benchmarks/results/loadgen_vs_vllm_bench_bfdb36e_client_at_normal_policy.json`). On an AVX2 host
the normal policy made no significant difference (`loadgen_vs_vllm_bench_5e3bd4d_avx2_host.json`, its
`ours_normal_policy` arm): how much the policy matters depends on the host. Under FIFO the thread
runs as soon as its socket is readable and yields the core as soon as it waits again, so it takes
no more CPU time than before, only earlier.

The kernel's real-time throttling (`/proc/sys/kernel/sched_rt_runtime_us`) keeps a runaway FIFO
thread from holding a core for good. The policy is set with SCHED_RESET_ON_FORK, so a process
started from the thread (an engine, a client process) starts at the normal policy, and the
previous policy is restored when the replay ends. A host that refuses it (no CAP_SYS_NICE, a
container without real-time budget) runs the replay at the normal policy, and says so.

Only a target on this host gets it (`on_this_host`): a remote endpoint (a prospect's provider in a
benchmark) shares no core with the client, so the policy would buy nothing there, and an endpoint
that streams without pause would then keep a real-time thread busy on one of our cores.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

FIFO = "fifo"
REALTIME_PRIORITY = 1  # the lowest real-time priority: above every normal thread, below the kernel's own


def on_this_host(base_url: str) -> bool:
    """Whether `base_url` names this host: localhost or a loopback address (where a client and
    the engine it measures share cores)."""
    host = (urlsplit(base_url).hostname or "").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@contextmanager
def prompt_reads(enabled: bool = True, *, why_not: str = "not asked") -> Iterator[str]:
    """Run the calling thread under SCHED_FIFO for the block; yields the policy it ran under:
    "fifo", or "normal" with the reason FIFO was not used (`why_not` where not `enabled`)."""
    if not enabled:
        yield f"normal ({why_not})"
        return
    setter = getattr(os, "sched_setscheduler", None)
    if setter is None:
        yield "normal (no sched_setscheduler on this platform)"
        return
    previous_policy = os.sched_getscheduler(0)
    previous_param = os.sched_getparam(0)
    try:
        setter(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(REALTIME_PRIORITY))
    except OSError as exc:  # PermissionError where the host grants no real-time policy
        yield f"normal ({type(exc).__name__}: {exc.strerror or exc})"
        return
    try:
        yield FIFO
    finally:
        os.sched_setscheduler(0, previous_policy, previous_param)
