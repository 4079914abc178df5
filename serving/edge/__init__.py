"""The measuring point at the edge of an endpoint (issue 23): a reverse proxy in front of the
engine that records every generation request's arrival, time to first token and outcome as the
client sees them, and posts them in batches, with the spans of time it covered, to the portal's
SLA ingest (`/sla/edge/`). `python -m serving.edge --help` runs it on its own; the local runner
starts it in front of the router when a launch names an ingest URL."""

from serving.edge.proxy import MEASURED_PATHS, REQUEST_ID_HEADER, EdgeProxy, EdgeProxySettings
from serving.edge.records import BufferStats, EdgeBuffer, EdgeRequestRecord, Segment
from serving.edge.shipper import IngestShipper, IngestTarget

TOKEN_ENV = "TAILGUARD_EDGE_INGEST_TOKEN"

__all__ = [
    "MEASURED_PATHS",
    "REQUEST_ID_HEADER",
    "TOKEN_ENV",
    "BufferStats",
    "EdgeBuffer",
    "EdgeProxy",
    "EdgeProxySettings",
    "EdgeRequestRecord",
    "IngestShipper",
    "IngestTarget",
    "Segment",
]
