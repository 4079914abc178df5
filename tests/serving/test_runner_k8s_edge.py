"""The SLA's measuring proxy as a sidecar of a Kubernetes endpoint (issue 23, edge on clusters).

No cluster exists here: the manifests are proven against the official client's models by round
trip, the sidecar's flags against the proxy's own parser, and the runner is followed up to the
cluster call (where `k8s.apply` is the boundary we cannot run).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from serving.edge import TOKEN_ENV
from serving.edge.cli import build_parser
from serving.engine import EngineConfig
from serving.runner import k8s, k8s_tables
from serving.runner.base import EndpointLaunch, RunnerError, RunnerHandle
from serving.runner.k8s import EndpointSpec, InvalidEndpointSpec, ModelRef, render
from serving.runner.k8s_edge import EDGE_PORT, EdgeSidecar
from serving.runner.k8s_runner import ClusterTarget, KubernetesRunner, object_name
from serving.runner.k8s_schema import round_trip

EDGE = EdgeSidecar(
    ingest_url="https://portal.example.com/sla/edge/",
    endpoint_id="6f1c2d9e-1111-4222-8333-944455556666",
    image="registry.example.com/tailguard:1.4",
    token_secret="chat-key",
)


def _spec(**overrides: Any) -> EndpointSpec:
    values: dict[str, Any] = {
        "name": "chat",
        "namespace": "tenant-a",
        "config": EngineConfig(),
        "model": ModelRef(name="house-model", path="/models/house-model", pvc="weights"),
        "hardware": "h100",
        "region": "us-east-1",
        "allowed_regions": frozenset({"us"}),
        "api_key_secret": "chat-key",
        "edge": EDGE,
    }
    values.update(overrides)
    return EndpointSpec(**values)


def test_clients_enter_through_the_proxy_and_the_probes_reach_the_engine() -> None:
    rendered = render(_spec())
    deployment = round_trip(rendered.objects[0], "V1Deployment")
    service = round_trip(rendered.objects[1], "V1Service")
    engine, edge = deployment.spec.template.spec.containers
    assert (engine.name, edge.name) == ("vllm", "edge")
    # The Service's "http" is the proxy's port; the engine keeps its own, which the kubelet probes.
    assert service.spec.ports[0].target_port == "http"
    assert [(p.name, p.container_port) for p in edge.ports] == [("http", EDGE_PORT)]
    assert [(p.name, p.container_port) for p in engine.ports] == [("engine", k8s.ENGINE_PORT)]
    for probe in (engine.startup_probe, engine.readiness_probe, engine.liveness_probe):
        assert probe.http_get.port == "engine" and probe.http_get.path == "/health"
    assert edge.readiness_probe.tcp_socket.port == "http"
    # The proxy's own parser reads the rendered flags: listening on the pod, forwarding to the
    # engine on loopback, posting to the portal for this endpoint.
    assert edge.command == ["python", "-m", "serving.edge"]
    args = build_parser().parse_args(edge.args)
    assert args.listen == ("0.0.0.0", EDGE_PORT)  # noqa: S104 - the pod's addresses
    assert args.upstream == f"http://127.0.0.1:{k8s.ENGINE_PORT}"
    assert (args.ingest_url, args.endpoint_id) == (EDGE.ingest_url, EDGE.endpoint_id)
    # The token comes from the endpoint's Secret through the environment, never as a flag.
    (env,) = edge.env
    assert env.name == TOKEN_ENV and env.value is None
    assert (env.value_from.secret_key_ref.name, env.value_from.secret_key_ref.key) == (
        "chat-key",
        "edge-token",
    )
    assert not any("token" in a.lower() for a in edge.args)
    assert edge.resources.limits == {"memory": "512Mi"}


def test_tuned_tables_reach_the_engine_not_the_proxy() -> None:
    entry = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1}
    table = {"1": entry | {"num_warps": 4, "num_stages": 3}}
    tables = k8s_tables.tables_from_files({"E=128,N=768,device_name=NVIDIA_H200.json": json.dumps(table)})
    spec = _spec(
        hardware="h200",
        model=ModelRef(name="qwen3-30b-a3b", path="/models/qwen3-30b-a3b", pvc="weights"),
        moe_tables=tables,
    )
    rendered = render(spec)
    assert [o["kind"] for o in rendered.objects] == ["ConfigMap", "Deployment", "Service"]
    deployment = round_trip(rendered.objects[1], "V1Deployment")
    engine, edge = deployment.spec.template.spec.containers
    assert any(m.mount_path == k8s_tables.TABLES_MOUNT for m in engine.volume_mounts)
    assert edge.volume_mounts is None and [e.name for e in edge.env] == [TOKEN_ENV]


def test_without_the_proxy_the_engine_serves_the_services_port_alone() -> None:
    deployment = round_trip(render(_spec(edge=None)).objects[0], "V1Deployment")
    (engine,) = deployment.spec.template.spec.containers
    assert [(p.name, p.container_port) for p in engine.ports] == [("http", k8s.ENGINE_PORT)]
    assert engine.readiness_probe.http_get.port == "http"


def test_on_several_nodes_only_the_leaders_carry_the_proxy() -> None:
    config = EngineConfig(tensor_parallel_size=8, extra_args=("--pipeline-parallel-size", "2"))
    rendered = render(_spec(hardware="h200", config=config))
    group = rendered.objects[0]["spec"]["leaderWorkerTemplate"]
    leader = round_trip(group["leaderTemplate"], "V1PodTemplateSpec")
    worker = round_trip(group["workerTemplate"], "V1PodTemplateSpec")
    assert [c.name for c in leader.spec.containers] == ["vllm", "edge"]
    assert [c.name for c in worker.spec.containers] == ["vllm"]


@pytest.mark.parametrize(
    ("edge", "message"),
    [
        (replace(EDGE, ingest_url="ftp://portal.example.com/sla/edge/"), "expected an http"),
        (replace(EDGE, image="tailguard latest"), "not an image reference"),
        (replace(EDGE, token_secret="Chat_Key"), "token_secret"),
        (replace(EDGE, endpoint_id=" "), "endpoint's id"),
    ],
    ids=["ingest-scheme", "image", "secret-name", "endpoint-id"],
)
def test_a_sidecar_the_cluster_or_the_proxy_would_refuse_is_refused_naming_the_field(
    edge: EdgeSidecar, message: str
) -> None:
    with pytest.raises(InvalidEndpointSpec, match=message) as err:
        render(_spec(edge=edge))
    assert err.value.field == "edge"


def _launch(**overrides: Any) -> EndpointLaunch:
    values: dict[str, Any] = {
        "endpoint_id": EDGE.endpoint_id,
        "model": "/models/house-model",
        "config": EngineConfig().to_mapping(),
        "api_key": "tgk_abcd_secret",
        "edge_ingest_url": EDGE.ingest_url,
        "edge_ingest_token": "edge-secret-token",
    }
    values.update(overrides)
    return EndpointLaunch(**values)


TARGET = ClusterTarget(
    namespace="llm",
    hardware="h100",
    region="us-east-1",
    allowed_regions=frozenset({"us"}),
    edge_image=EDGE.image,
)


def test_the_runner_adds_the_proxy_only_with_an_image_and_the_portals_ingest() -> None:
    name = object_name(EDGE.endpoint_id)
    runner = KubernetesRunner(TARGET)
    edge = runner._edge(name, _launch())
    assert edge is not None and edge.token_secret == f"{name}-key" and edge.image == EDGE.image
    assert runner._edge(name, _launch(edge_ingest_url=None)) is None  # the portal's ingest is off
    assert runner._edge(name, _launch(edge_ingest_token="")) is None
    assert KubernetesRunner(replace(TARGET, edge_image=None))._edge(name, _launch()) is None


def test_a_bad_edge_image_is_refused_before_anything_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []
    monkeypatch.setattr(KubernetesRunner, "_call", lambda self, method, path, body=None: sent.append(path))
    with pytest.raises(RunnerError, match=r"not an image reference \[edge\]"):
        KubernetesRunner(replace(TARGET, edge_image="tailguard latest")).start(_launch())
    assert sent == []


def test_a_new_configuration_keeps_the_proxy_and_the_secret_holds_its_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The cluster is the boundary we cannot run: what would be sent to it is recorded instead.
    calls: list[tuple[str, str, Any]] = []
    applied: list[k8s.RenderedEndpoint] = []

    def call(self: KubernetesRunner, method: str, path: str, body: Any = None) -> Any:
        calls.append((method, path, body))
        return None  # no such Secret yet: it is created

    monkeypatch.setattr(KubernetesRunner, "_call", call)
    monkeypatch.setattr(k8s, "apply", lambda rendered, *args, **kwargs: applied.append(rendered))
    runner = KubernetesRunner(TARGET)
    handle = runner.start(_launch())
    posted = [body for method, _, body in calls if method == "POST"]
    assert sorted(posted[0]["data"]) == ["api-key", "edge-token"]
    assert handle.data["edge"] == {
        "ingest_url": EDGE.ingest_url,
        "image": EDGE.image,
        "endpoint_id": EDGE.endpoint_id,
    }

    runner.apply_config(RunnerHandle.from_dict(handle.to_dict()), EngineConfig(max_num_seqs=64).to_mapping())
    for rendered in applied:
        containers = rendered.objects[0]["spec"]["template"]["spec"]["containers"]
        assert [c["name"] for c in containers] == ["vllm", "edge"]
    assert "--max-num-seqs" in applied[-1].objects[0]["spec"]["template"]["spec"]["containers"][0]["args"]
