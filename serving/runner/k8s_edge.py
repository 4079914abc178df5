"""The SLA's measuring proxy as a sidecar of a Kubernetes endpoint's serving pods.

On a cluster the edge proxy (`serving.edge`) runs beside the engine in every serving pod (the
LeaderWorkerSet's leaders): it listens on `EDGE_PORT` under the port name the Service targets, so
every client request enters through it, and forwards to the engine on the pod's loopback. The
engine keeps its own port (`engine`), which the kubelet's probes use. The ingest token comes from
a Secret through the environment (`serving.edge.TOKEN_ENV`), as the proxy requires: never a flag.

The sidecar's command line is checked by the proxy's own argument parser before anything is
rendered, so a manifest never carries flags the proxy would refuse at start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NoReturn

from serving.edge import TOKEN_ENV
from serving.edge.cli import build_parser

EDGE_PORT = 8080  # the proxy's port in the pod: the Service's "http" target when the sidecar runs
CONTAINER_NAME = "edge"
TOKEN_KEY = "edge-token"  # the key of the endpoint's Secret that holds the ingest token
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class EdgeSidecarRefused(ValueError):
    """The sidecar cannot be rendered as asked; the message says why."""


@dataclass(frozen=True)
class EdgeSidecar:
    """Where the proxy posts its records and what it runs as."""

    ingest_url: str  # the portal's SLA ingest, …/sla/edge/
    endpoint_id: str  # the portal's id of the endpoint (the records name it)
    image: str  # an image with Tailguard installed (`python -m serving.edge`)
    token_secret: str  # the Secret holding the ingest token under `token_secret_key`
    token_secret_key: str = TOKEN_KEY
    cpu: str = "500m"
    memory: str = "512Mi"


def args_for(edge: EdgeSidecar, *, engine_port: int) -> list[str]:
    """The proxy's flags: listen on every address of the pod, forward to the engine on loopback."""
    return [
        "--listen",
        f"0.0.0.0:{EDGE_PORT}",
        "--upstream",
        f"http://127.0.0.1:{engine_port}",
        "--ingest-url",
        edge.ingest_url,
        "--endpoint-id",
        edge.endpoint_id,
    ]


def check(edge: EdgeSidecar, *, engine_port: int) -> None:
    """Refuse a sidecar the cluster or the proxy would refuse, naming what is wrong."""
    if not edge.image.strip() or any(c.isspace() for c in edge.image):
        raise EdgeSidecarRefused(f"edge image {edge.image!r} is not an image reference")
    for what, name in (("token_secret", edge.token_secret), ("token_secret_key", edge.token_secret_key)):
        if not _OBJECT_NAME.match(name) or len(name) > 253:
            raise EdgeSidecarRefused(f"{what} {name!r} is not a valid object name")
    if not edge.endpoint_id.strip():
        raise EdgeSidecarRefused("the edge proxy needs the endpoint's id")
    if engine_port == EDGE_PORT:
        raise EdgeSidecarRefused(f"the engine and the edge proxy cannot both listen on port {EDGE_PORT}")
    parser = build_parser()

    def refuse(message: str) -> NoReturn:  # argparse would print and exit
        raise EdgeSidecarRefused(f"the edge proxy would refuse its flags: {message}")

    parser.error = refuse  # type: ignore[method-assign]
    parser.parse_args(args_for(edge, engine_port=engine_port))


def container(edge: EdgeSidecar, *, engine_port: int) -> Any:
    """The sidecar container (a `kubernetes.client.V1Container`), checked first."""
    from kubernetes import client

    check(edge, engine_port=engine_port)
    tcp = client.V1TCPSocketAction(port="http")
    return client.V1Container(
        name=CONTAINER_NAME,
        image=edge.image,
        image_pull_policy="IfNotPresent",
        command=["python", "-m", "serving.edge"],
        args=args_for(edge, engine_port=engine_port),
        env=[
            client.V1EnvVar(
                name=TOKEN_ENV,
                value_from=client.V1EnvVarSource(
                    secret_key_ref=client.V1SecretKeySelector(
                        name=edge.token_secret, key=edge.token_secret_key, optional=False
                    )
                ),
            )
        ],
        ports=[client.V1ContainerPort(name="http", container_port=EDGE_PORT, protocol="TCP")],
        # The proxy is ready once it listens; the pod is ready only when the engine is too.
        readiness_probe=client.V1Probe(tcp_socket=tcp, period_seconds=5, failure_threshold=3),
        liveness_probe=client.V1Probe(tcp_socket=tcp, period_seconds=10, failure_threshold=6),
        resources=client.V1ResourceRequirements(
            requests={"cpu": edge.cpu, "memory": edge.memory}, limits={"memory": edge.memory}
        ),
    )
