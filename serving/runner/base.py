"""One interface for running an endpoint, whatever runs it.

The portal never holds an engine process. It asks a runner to `start` an endpoint and keeps only
what comes back, a `RunnerHandle` (JSON: where the endpoint runs and how to find it again), and
the last `RunnerState`; everything later goes through the same runner with that handle: a new
configuration (`apply_config`, swapped without failing requests where the runner can), `stop`,
`state`, and `metrics_window` (the engine's counters now, and the interval since the previous
reading). Two implementations:

- `serving.runner.supervisor.LocalSupervisorRunner`: the `tailguard endpoint serve` supervisor
  (router + engine, crash restarts, zero-failure swaps) as a detached process on the machine
  that calls it, which in the portal is always an engine host's agent;
- `serving.runner.k8s_runner.KubernetesRunner`: the rendered manifests, server-side applied.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from serving.metrics import MetricsDelta, MetricsFormatError, VllmSnapshot, snapshot_delta, snapshot_from_text

# What a runner reports; the portal shows these words.
STATUSES = ("starting", "healthy", "restarting", "degraded", "failed", "stopped")


class RunnerError(RuntimeError):
    """The runner could not do what was asked; the message says why in words a user can act on."""


@dataclass(frozen=True)
class EndpointLaunch:
    """Everything a runner needs to start one endpoint."""

    endpoint_id: str  # stable id: names the endpoint's files or cluster objects
    model: str  # model directory (local) or served model path (cluster)
    # The configuration to serve: `EngineConfig.to_mapping()` (no key in it), as the portal stores it.
    config: dict[str, Any]
    api_key: str = field(default="", repr=False)  # never printed
    # The stable port clients reach (behind the pool's public address). None: the runner picks
    # a free one on the host it starts the endpoint on and reports it in the handle
    # (`data["port"]`); only that host knows which of its ports are free.
    port: int | None = None
    bind_address: str = "127.0.0.1"  # where the endpoint listens on its host
    # Ports the runner must not pick (e.g. those of this host's stopped endpoints, which clients
    # may still call): a new endpoint never answers at an old one's address.
    avoid_ports: tuple[int, ...] = ()
    # The SLA's measuring point (issue 23): with an ingest URL (the portal's /sla/edge/) and its
    # token, a proxy in front of the engine measures every request where it enters the endpoint
    # and posts the records there; the endpoint's address is then the proxy's.
    edge_ingest_url: str | None = None
    edge_ingest_token: str = field(default="", repr=False)  # never printed
    # Tuned fused-MoE tables of the revision to serve (vLLM file name -> table JSON), checked by
    # the portal against the endpoint's hardware and model; the runner puts them where the
    # engine reads them and points VLLM_TUNED_CONFIG_FOLDER there. Empty: vLLM's own tables.
    moe_tables: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class RunnerHandle:
    """Where an endpoint runs and how to find it again; stored by the portal as JSON."""

    kind: str  # "local" or "kubernetes"
    data: dict[str, Any]  # the implementation's own keys (a folder and pid; a namespace and name)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.data}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RunnerHandle:
        data = dict(raw)
        kind = str(data.pop("kind", ""))
        if not kind:
            raise RunnerError("the stored runner handle names no runner")
        return cls(kind=kind, data=data)


@dataclass(frozen=True)
class RunnerState:
    status: str  # one of STATUSES
    detail: str = ""  # the runner's last error or a note, cause first
    engine_url: str | None = None  # where the engine's own /metrics answers, when known
    generation: int = 0  # configurations deployed since the start
    restarts: int = 0  # crash restarts in the runner's current window
    config: dict[str, Any] | None = None  # the configuration actually serving, when known
    raw: dict[str, Any] = field(default_factory=dict, repr=False)  # the runner's full report


@dataclass(frozen=True)
class MetricsReading:
    """The engine's Prometheus text at one moment."""

    text: str = field(repr=False)
    taken_at_s: float  # wall-clock seconds


@dataclass(frozen=True)
class MetricsWindow:
    """One scrape: the reading now, and the interval since `previous` when it can be measured.

    `delta` is None with `reason` when it cannot: no earlier reading, the engine restarted
    (its counters went back), or the earlier reading does not parse."""

    reading: MetricsReading
    delta: MetricsDelta | None
    reason: str = ""


def _counters_went_back(earlier: VllmSnapshot, later: VllmSnapshot) -> bool:
    """Whether `later` comes from another engine than `earlier` (its totals started again)."""
    pairs = [
        (earlier.requests_finished_total, later.requests_finished_total),
        (earlier.prompt_tokens_total, later.prompt_tokens_total),
        (earlier.generation_tokens_total, later.generation_tokens_total),
        (earlier.ttft_s.count, later.ttft_s.count),
    ]
    return any(b < a for a, b in pairs)


def window_between(
    previous: MetricsReading | None, text: str, *, taken_at_s: float | None = None
) -> MetricsWindow:
    """The window from `previous` to the engine's `text` now. Raises MetricsFormatError when
    `text` is not the engine's metrics (a gap, never zeros)."""
    now = time.time() if taken_at_s is None else taken_at_s
    current = snapshot_from_text(text, taken_at_s=now)
    reading = MetricsReading(text=text, taken_at_s=now)
    if previous is None:
        return MetricsWindow(
            reading, None, "no earlier scrape to measure from (the first, or the first after a gap)"
        )
    try:
        earlier = snapshot_from_text(previous.text, taken_at_s=previous.taken_at_s)
        if _counters_went_back(earlier, current):
            return MetricsWindow(
                reading, None, "the engine restarted since the last scrape (its counters started again)"
            )
        return MetricsWindow(reading, snapshot_delta(earlier, current))
    except (MetricsFormatError, ValueError):
        return MetricsWindow(reading, None, "the previous scrape could not be compared with this one")


@runtime_checkable
class EndpointRunner(Protocol):
    kind: str

    def start(self, launch: EndpointLaunch) -> RunnerHandle:
        """Start serving (idempotent: an endpoint already running under this id is kept)."""
        ...

    def apply_config(
        self, handle: RunnerHandle, config: dict[str, Any], *, moe_tables: dict[str, str] | None = None
    ) -> bool:
        """Serve `config` (with `moe_tables`, as in `EndpointLaunch`) from now on; False when it
        already does (nothing to do)."""
        ...

    def stop(self, handle: RunnerHandle, *, timeout_s: float = 60.0) -> None:
        """Stop serving and revoke the endpoint's key where the runner holds it."""
        ...

    def state(self, handle: RunnerHandle) -> RunnerState: ...

    def metrics_window(
        self, handle: RunnerHandle, previous: MetricsReading | None, *, timeout_s: float = 5.0
    ) -> MetricsWindow:
        """Scrape the engine now. Raises RunnerError when it cannot be reached or answers garbage."""
        ...
