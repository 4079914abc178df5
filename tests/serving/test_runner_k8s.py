"""The Kubernetes runner: manifests checked against the API schema, placements refused by the rules.

No cluster exists here, so `apply` is exercised up to "no cluster configured"; everything it
would send is proven against the official client's models (and, for the LeaderWorkerSet, its
own schema) by round trip.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.catalog import ModelDoesNotFit, get_hardware
from serving.engine import EngineConfig, validate_args, vllm_importable
from serving.runner import k8s
from serving.runner.k8s import (
    EndpointSpec,
    EngineNotSupported,
    HardwareNotOffered,
    InvalidEndpointSpec,
    K8sRenderError,
    ModelRef,
    ModelWontFit,
    NoClusterConfigured,
    ParallelismTooLarge,
    ResidencyRefused,
    render,
)
from serving.runner.k8s_schema import ManifestSchemaError, round_trip, validate_manifest
from tailguard.cli import main

US = frozenset({"us"})


def _spec(**overrides: Any) -> EndpointSpec:
    values: dict[str, Any] = {
        "name": "chat",
        "namespace": "tenant-a",
        "config": EngineConfig(),
        "model": ModelRef(name="llama-3.1-8b", path="/models/llama-3.1-8b", pvc="weights"),
        "hardware": "h100",
        "region": "us-east-1",
        "allowed_regions": US,
        "api_key_secret": "chat-key",
    }
    values.update(overrides)
    return EndpointSpec(**values)


def _container(template: dict[str, Any]) -> dict[str, Any]:
    containers = template["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


# -- single node: a Deployment -------------------------------------------------------------------

SINGLE_NODE_CASES = [
    # hardware, region, tensor parallel, image, resource, node label that must be selected
    ("h100", "us-east-1", 1, None, "nvidia.com/gpu", ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")),
    ("h200", "eastus2", 8, None, "nvidia.com/gpu", None),
    ("b200", "us-east", 4, None, "nvidia.com/gpu", ("nvidia.com/gpu.product", "NVIDIA-B200")),
    ("mi300x", "eastus", 8, "rocm/vllm:custom", "amd.com/gpu", ("amd.com/gpu.device-id", "74a1")),
    ("mi355x", "us-ashburn-1", 2, "rocm/vllm:custom", "amd.com/gpu", ("amd.com/gpu.device-id", "75a3")),
    (
        "tpu-v6e",
        "us-east5-a",
        4,
        "vllm/vllm-tpu:custom",
        "google.com/tpu",
        ("cloud.google.com/gke-tpu-accelerator", "tpu-v6e-slice"),
    ),
    (
        "trainium2",
        "us-east-2",
        16,
        "example/vllm-neuron:custom",
        "aws.amazon.com/neuron",
        ("node.kubernetes.io/instance-type", "trn2.48xlarge"),
    ),
]


@pytest.mark.parametrize(("hardware", "region", "tp", "image", "resource", "label"), SINGLE_NODE_CASES)
def test_single_node_renders_a_deployment_that_round_trips_through_the_client_models(
    hardware: str, region: str, tp: int, image: str | None, resource: str, label: tuple[str, str] | None
) -> None:
    # A non-catalog model name: this test is about placement, not memory.
    spec = _spec(
        hardware=hardware,
        region=region,
        image=image,
        config=EngineConfig(tensor_parallel_size=tp),
        model=ModelRef(name="house-model", path="/models/house-model", pvc="weights"),
    )
    rendered = render(spec)
    assert rendered.workload_kind == "Deployment"
    assert [o["kind"] for o in rendered.objects] == ["Deployment", "Service"]
    deployment = round_trip(rendered.objects[0], "V1Deployment")
    service = round_trip(rendered.objects[1], "V1Service")

    pod = deployment.spec.template.spec
    container = pod.containers[0]
    assert container.resources.limits[resource] == str(tp)
    assert container.resources.requests[resource] == str(tp)
    assert container.resources.requests["cpu"] == str(4 * tp)
    assert container.resources.requests["memory"] == f"{32 * tp}Gi"
    assert [t.key for t in pod.tolerations] == [resource]
    if label is not None:
        assert pod.node_selector[label[0]] == label[1]
    region_key = "topology.kubernetes.io/zone" if hardware == "tpu-v6e" else "topology.kubernetes.io/region"
    assert pod.node_selector[region_key] == region
    # The Service reaches exactly the serving pods of this endpoint.
    assert service.spec.selector == deployment.spec.selector.match_labels
    assert set(service.spec.selector.items()) <= set(deployment.spec.template.metadata.labels.items())
    assert deployment.metadata.labels["tailguard.io/endpoint"] == "chat"
    assert deployment.metadata.labels["tailguard.io/hardware"] == get_hardware(hardware).name


def test_probes_hit_the_engine_health_route_with_a_startup_allowance() -> None:
    rendered = render(_spec(startup_timeout_s=1200))
    container = _container(rendered.objects[0]["spec"]["template"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http", "scheme": "HTTP"}
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == 1200
    # Liveness gives up far sooner than start-up: it only runs once the engine has started.
    liveness = container["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] < 1200
    assert container["ports"] == [{"containerPort": 8000, "name": "http", "protocol": "TCP"}]


def test_engine_flags_env_shm_and_the_api_key_secret() -> None:
    config = EngineConfig(
        tensor_parallel_size=2, max_num_seqs=64, enable_prefix_caching=True, cpu_kv_cache_space_gib=3
    )
    rendered = render(_spec(config=config, api_key_secret="chat-key", shm_gib=8))
    template = rendered.objects[0]["spec"]["template"]
    container = _container(template)
    assert container["command"] == ["vllm", "serve"]
    args = container["args"]
    # The engine config's own rendering, with the pod's address and the served name.
    expected = replace(config, served_model_name="llama-3.1-8b").to_args(
        model="/models/llama-3.1-8b",
        host="0.0.0.0",  # noqa: S104
        port=8000,
    )
    assert args == expected
    env = {e["name"]: e for e in container["env"]}
    assert env["VLLM_CPU_KVCACHE_SPACE"]["value"] == "3"
    assert env["HF_HUB_OFFLINE"]["value"] == "1"
    assert env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "chat-key",
        "key": "api-key",
        "optional": False,
    }
    assert "--api-key" not in args
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["shm"]["mountPath"] == "/dev/shm"
    assert mounts["model"] == {"name": "model", "mountPath": "/models", "readOnly": True}
    # The shm is memory-backed and charged to the pod: the limit leaves room for it.
    assert container["resources"]["limits"]["memory"] == f"{64 + 8}Gi"
    assert template["spec"]["enableServiceLinks"] is False


def test_an_api_key_in_the_config_is_refused_rather_than_written_in_plain_text() -> None:
    with pytest.raises(InvalidEndpointSpec, match="plain text") as err:
        render(_spec(config=EngineConfig(api_key="sk-secret")))
    assert err.value.field == "config.api_key"


# -- several nodes: a LeaderWorkerSet ------------------------------------------------------------

MULTI_NODE_CASES = [
    # hardware, region, tensor parallel, pipeline parallel, image, expected nodes, devices per node
    ("h200", "us-east-1", 8, 2, None, 2, 8),
    ("h100", "us-west-2", 16, 1, None, 2, 8),
    ("b300", "eu-central", 8, 4, None, 4, 8),
    ("mi300x", "westeurope", 8, 3, "rocm/vllm:custom", 3, 8),
]


@pytest.mark.parametrize(("hardware", "region", "tp", "pp", "image", "nodes", "per_node"), MULTI_NODE_CASES)
def test_multi_node_renders_a_leaderworkerset_whose_templates_round_trip(
    hardware: str, region: str, tp: int, pp: int, image: str | None, nodes: int, per_node: int
) -> None:
    config = EngineConfig(tensor_parallel_size=tp, extra_args=("--pipeline-parallel-size", str(pp)))
    spec = _spec(
        hardware=hardware,
        region=region,
        image=image,
        config=config,
        allowed_regions=frozenset({"us", "eu"}),
        model=ModelRef(name="house-model", path="/models/m", pvc="weights"),
        replicas=2,
    )
    rendered = render(spec)
    assert rendered.workload_kind == "LeaderWorkerSet"
    lws, service_data = rendered.objects
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert lws["spec"]["replicas"] == 2
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == nodes
    assert group["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader = round_trip(group["leaderTemplate"], "V1PodTemplateSpec")
    worker = round_trip(group["workerTemplate"], "V1PodTemplateSpec")
    resource = "amd.com/gpu" if hardware.startswith("mi") else "nvidia.com/gpu"
    for pod in (leader, worker):
        assert pod.spec.containers[0].resources.limits[resource] == str(per_node)
        assert pod.spec.node_selector["topology.kubernetes.io/region"] == region

    leader_args = leader.spec.containers[0].args
    worker_args = worker.spec.containers[0].args
    for args in (leader_args, worker_args):
        assert args[args.index("--nnodes") + 1] == str(nodes)
        assert args[args.index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
        assert args[args.index("--distributed-executor-backend") + 1] == "mp"
        assert args[args.index("--tensor-parallel-size") + 1] == str(tp)
    assert leader_args[leader_args.index("--node-rank") + 1] == "0"
    assert "--headless" not in leader_args
    assert worker_args[worker_args.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
    assert "--headless" in worker_args
    # Only the leader serves HTTP: it alone has the port, the probes and the Service.
    assert leader.spec.containers[0].readiness_probe.http_get.path == "/health"
    assert worker.spec.containers[0].readiness_probe is None
    assert worker.spec.containers[0].ports is None
    service = round_trip(service_data, "V1Service")
    assert set(service.spec.selector.items()) <= set(leader.metadata.labels.items())
    assert not set(service.spec.selector.items()) <= set(worker.metadata.labels.items())


@pytest.mark.skipif(not vllm_importable(), reason="uses vLLM's own parser")
def test_vllm_parses_the_leader_and_worker_flags() -> None:
    config = EngineConfig(
        tensor_parallel_size=8, max_num_seqs=128, extra_args=("--pipeline-parallel-size", "2")
    )
    rendered = render(_spec(hardware="h200", config=config))
    group = rendered.objects[0]["spec"]["leaderWorkerTemplate"]
    for template in (group["leaderTemplate"], group["workerTemplate"]):
        # Kubernetes expands $(VAR) from the LWS-injected environment before the engine sees it.
        args = [
            a.replace("$(LWS_LEADER_ADDRESS)", "chat-0.chat").replace("$(LWS_WORKER_INDEX)", "1")
            for a in _container(template)["args"]
        ]
        validate_args(args)


# -- the schema check itself ---------------------------------------------------------------------


def _deployment() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(render(_spec()).objects[0]))
    return data


def _lws() -> dict[str, Any]:
    config = EngineConfig(tensor_parallel_size=8, extra_args=("--pipeline-parallel-size", "2"))
    data: dict[str, Any] = json.loads(json.dumps(render(_spec(hardware="h200", config=config)).objects[0]))
    return data


def test_the_schema_check_refuses_unknown_fields_and_wrong_types_naming_the_path() -> None:
    bad = _deployment()
    bad["spec"]["template"]["spec"]["containers"][0]["gpuCount"] = 2
    with pytest.raises(ManifestSchemaError) as err:
        validate_manifest(bad)
    assert err.value.path == "spec.template.spec.containers[0].gpuCount"

    bad = _deployment()
    bad["spec"]["replicas"] = "2"  # the client would quietly coerce it
    with pytest.raises(ManifestSchemaError) as err:
        validate_manifest(bad)
    assert err.value.path == "spec.replicas"

    bad = _deployment()
    bad["spec"]["template"]["spec"]["enableServiceLinks"] = "no"
    with pytest.raises(ManifestSchemaError, match="enableServiceLinks"):
        validate_manifest(bad)

    bad = _deployment()
    bad["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(ManifestSchemaError) as err:
        validate_manifest(bad)
    assert err.value.path == "spec.template.spec.containers[0].ports[0].containerPort"

    bad = _deployment()
    del bad["spec"]["template"]["spec"]["containers"][0]["name"]  # required by the schema
    with pytest.raises(ManifestSchemaError, match="name") as err:
        validate_manifest(bad)
    assert err.value.path == "spec.template.spec.containers[0]"


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d["spec"].update(partitions=2), "spec.partitions"),
        (
            lambda d: d["spec"]["leaderWorkerTemplate"].update(restartPolicy="Always"),
            "spec.leaderWorkerTemplate.restartPolicy",
        ),
        (lambda d: d["spec"]["leaderWorkerTemplate"].update(size=0), "spec.leaderWorkerTemplate.size"),
        (lambda d: d["spec"]["leaderWorkerTemplate"].update(size=True), "spec.leaderWorkerTemplate.size"),
        (lambda d: d["spec"].update(startupPolicy="Eager"), "spec.startupPolicy"),
        (
            lambda d: d["spec"]["leaderWorkerTemplate"].pop("workerTemplate"),
            "spec.leaderWorkerTemplate.workerTemplate",
        ),
        (
            lambda d: d["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"].update(maxSurge="a lot"),
            "spec.rolloutStrategy.rollingUpdateConfiguration.maxSurge",
        ),
        (lambda d: d.update(apiVersion="leaderworkerset.x-k8s.io/v2"), "apiVersion"),
        (
            lambda d: d["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0].update(
                gpus=8
            ),
            "spec.leaderWorkerTemplate.workerTemplate.spec.containers[0].gpus",
        ),
        (
            lambda d: d["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"].update(nodeSelector=["x"]),
            "spec.leaderWorkerTemplate.leaderTemplate.spec.nodeSelector",
        ),
    ],
)
def test_the_leaderworkerset_schema_refuses_what_the_lws_api_would(mutate: Any, path: str) -> None:
    data = _lws()
    validate_manifest(data)
    mutate(data)
    with pytest.raises(ManifestSchemaError) as err:
        validate_manifest(data)
    assert err.value.path.startswith(path)


# -- refusals ------------------------------------------------------------------------------------


def test_a_region_outside_the_residency_rule_is_refused() -> None:
    with pytest.raises(ResidencyRefused) as err:
        render(_spec(hardware="h200", region="eu-west-1", allowed_regions=US))
    assert err.value.field == "region"
    assert "'eu'" in str(err.value) and "data-residency" in str(err.value)
    # A region name may also be allowed by name.
    assert render(_spec(hardware="h200", region="eu-west-1", allowed_regions=frozenset({"eu-west-1"})))
    # A region the catalog does not know cannot be shown to be inside the rule.
    with pytest.raises(ResidencyRefused, match="does not know"):
        render(_spec(region="mars-north-1"))
    with pytest.raises(ResidencyRefused):
        render(_spec(allowed_regions=frozenset()))


def test_hardware_not_offered_in_the_region_is_refused_with_where_it_is() -> None:
    with pytest.raises(HardwareNotOffered) as err:
        render(_spec(hardware="h200", region="us-west-2"))  # us-west-2 offers H100, not H200
    assert err.value.field == "region"
    assert "us-east-1" in str(err.value) and "eastus2" in str(err.value)


def test_hardware_without_vllm_is_refused() -> None:
    no_vllm = replace(get_hardware("h100"), engines=("tensorrt-llm",))
    with pytest.raises(EngineNotSupported, match="not supported by vLLM") as err:
        render(_spec(hardware=no_vllm))
    assert err.value.field == "hardware"


@pytest.mark.parametrize(
    ("hardware", "region", "tp", "pp"),
    [
        ("tpu-v6e", "us-east5-a", 16, 1),  # more chips than one host; multi-host TPU is not rendered
        ("tpu-v6e", "us-east5-a", 2, 1),  # not a single-host slice shape
        ("trainium2", "us-east-2", 16, 2),
        ("h100", "us-east-1", 8, 17),  # 136 devices: more than 16 nodes of 8
        ("h100", "us-east-1", 131, 1),  # a prime above a node: no even split
    ],
)
def test_a_parallel_degree_the_hardware_cannot_provide_is_refused(
    hardware: str, region: str, tp: int, pp: int
) -> None:
    config = EngineConfig(tensor_parallel_size=tp, extra_args=("--pipeline-parallel-size", str(pp)))
    with pytest.raises(ParallelismTooLarge) as err:
        render(_spec(hardware=hardware, region=region, config=config, image="example/vllm:custom"))
    assert err.value.field == "tensor_parallel_size"


def test_a_catalog_model_that_does_not_fit_is_refused() -> None:
    with pytest.raises(ModelWontFit, match="does not fit") as err:
        render(_spec(model=ModelRef(name="llama-3.1-70b", path="/models/llama-3.1-70b", pvc="weights")))
    assert err.value.field == "model"
    assert isinstance(err.value, ModelDoesNotFit)
    # The same model on four devices fits.
    four = render(
        _spec(
            config=EngineConfig(tensor_parallel_size=4),
            model=ModelRef(name="llama-3.1-70b", path="/models/llama-3.1-70b", pvc="weights"),
        )
    )
    assert four.placement.fit_kv_tokens is not None and four.placement.fit_kv_tokens > 131072


def test_the_fit_check_needs_room_for_one_full_context() -> None:
    tpu = {"hardware": "tpu-v6e", "region": "us-east5-a", "image": "vllm/vllm-tpu:custom"}
    # The 8B model's weights fit one 32 GB chip, but not with its default 128k context.
    with pytest.raises(ModelWontFit, match="KV-cache tokens"):
        render(_spec(**tpu))
    assert render(_spec(config=EngineConfig(max_model_len=8192), **tpu)).placement.world_size == 1
    # Across nodes the fit is over the whole group.
    glm = ModelRef(name="glm-4.5", path="/models/glm-4.5", pvc="weights")
    with pytest.raises(ModelWontFit):
        render(_spec(model=glm, config=EngineConfig(tensor_parallel_size=8)))
    group = EngineConfig(tensor_parallel_size=8, extra_args=("--pipeline-parallel-size", "2"))
    assert render(_spec(model=glm, config=group)).placement.num_nodes == 2


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"name": "Chat"}, "name"),
        ({"name": "a" * 41}, "name"),
        ({"namespace": "tenant_a"}, "namespace"),
        ({"replicas": 0}, "replicas"),
        ({"model": ModelRef(name="m", path="meta-llama/Llama-3.1-8B")}, "model.path"),
        ({"model": ModelRef(name="m", path="/weights/m", pvc="weights")}, "model.path"),
        ({"model": ModelRef(name="m", path="/models/m", catalog_name="no-such-model")}, "model.catalog_name"),
        ({"api_key_secret": "Chat Key"}, "api_key_secret"),
        ({"hardware": "local-cpu"}, "hardware"),
        ({"hardware": "no-such-gpu"}, "hardware"),
        ({"hardware": "mi300x", "region": "eastus"}, "image"),
        ({"config": EngineConfig(extra_args=("--port", "9000"))}, "config.extra_args"),
        ({"config": EngineConfig(extra_args=("--pipeline-parallel-size=two",))}, "config.extra_args"),
        ({"shm_gib": 0}, "shm_gib"),
        ({"extra_labels": {"team": "a b"}}, "extra_labels"),
    ],
)
def test_bad_input_is_refused_naming_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(K8sRenderError) as err:
        render(_spec(**overrides))
    assert err.value.field == field


# -- a property over configurations --------------------------------------------------------------

_GPUS = [
    ("h100", "us-east-1", None),
    ("b200", "us-east", None),
    ("mi355x", "us-ashburn-1", "rocm/vllm:custom"),
]


@settings(max_examples=40, deadline=None)
@given(
    gpu=st.sampled_from(_GPUS),
    tp=st.sampled_from([1, 2, 4, 8, 16]),
    pp=st.integers(min_value=1, max_value=5),
    replicas=st.integers(min_value=1, max_value=4),
    max_num_seqs=st.none() | st.integers(min_value=1, max_value=1024),
    prefix_caching=st.none() | st.booleans(),
    catalog=st.booleans(),
)
def test_every_configuration_renders_schema_valid_manifests_or_a_typed_refusal(
    gpu: tuple[str, str, str | None],
    tp: int,
    pp: int,
    replicas: int,
    max_num_seqs: int | None,
    prefix_caching: bool | None,
    catalog: bool,
) -> None:
    hardware, region, image = gpu
    config = EngineConfig(
        tensor_parallel_size=tp,
        max_num_seqs=max_num_seqs,
        enable_prefix_caching=prefix_caching,
        extra_args=("--pipeline-parallel-size", str(pp)),
    )
    model = ModelRef(name="qwen3-32b" if catalog else "house-model", path="/models/m", pvc="weights")
    spec = _spec(hardware=hardware, region=region, image=image, config=config, model=model, replicas=replicas)
    try:
        rendered = render(spec)
    except (ParallelismTooLarge, ModelWontFit):
        return
    plan = rendered.placement
    per_node_max = get_hardware(hardware).max_devices_per_node
    assert plan.num_nodes * plan.devices_per_node == tp * pp
    assert plan.devices_per_node <= per_node_max
    assert rendered.workload_kind == ("Deployment" if tp * pp <= per_node_max else "LeaderWorkerSet")
    # What goes to disk is what was checked: the YAML reads back to schema-valid objects.
    reread = list(yaml.safe_load_all(k8s.to_yaml(rendered.objects)))
    assert reread == rendered.objects
    for obj in reread:
        validate_manifest(obj)


# -- apply without a cluster ---------------------------------------------------------------------


@pytest.fixture
def no_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent" / "config"))
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_apply_without_a_cluster_says_so(no_cluster: Path) -> None:
    rendered = render(_spec())
    with pytest.raises(NoClusterConfigured, match="no Kubernetes cluster is configured"):
        k8s.apply(rendered)
    missing = no_cluster / "nope.yaml"
    with pytest.raises(NoClusterConfigured, match="does not exist"):
        k8s.apply(rendered.objects, kube_config=missing)


def test_apply_checks_the_schema_before_looking_for_a_cluster(no_cluster: Path) -> None:
    bad = _deployment()
    bad["spec"]["replicaz"] = 2
    with pytest.raises(ManifestSchemaError, match="replicaz"):
        k8s.apply([bad])


# -- the command line ----------------------------------------------------------------------------


def _cli_args(tmp_path: Path, *extra: str) -> list[str]:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"tensor_parallel_size": 2, "max_num_seqs": 128}))
    return [
        "endpoint",
        "render-k8s",
        "--name",
        "chat",
        "--namespace",
        "tenant-a",
        "--model",
        "llama-3.1-8b",
        "--model-path",
        "/models/llama-3.1-8b",
        "--model-pvc",
        "weights",
        "--hardware",
        "H200",
        "--region",
        "us-east-1",
        "--allowed-regions",
        "us-east-1,us-west-2",
        "--config",
        str(config),
        "--api-key-secret",
        "chat-key",
        "--out",
        str(tmp_path / "out"),
        *extra,
    ]


def test_cli_writes_yaml_that_is_schema_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_cli_args(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "Deployment tenant-a/chat" in out
    files = sorted((tmp_path / "out").iterdir())
    assert [f.name for f in files] == ["00-deployment.yaml", "01-service.yaml"]
    deployment = yaml.safe_load(files[0].read_text())
    validate_manifest(deployment)
    validate_manifest(yaml.safe_load(files[1].read_text()))
    args = _container(deployment["spec"]["template"])["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert args[args.index("--max-num-seqs") + 1] == "128"
    assert (
        deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        == "2"
    )


def test_cli_apply_without_a_cluster_fails_clearly_after_writing(
    tmp_path: Path, no_cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_cli_args(tmp_path, "--apply")) == 1
    assert "not applied: no Kubernetes cluster is configured" in capsys.readouterr().err
    assert (tmp_path / "out" / "00-deployment.yaml").exists()


def test_cli_refusal_names_the_rule_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _cli_args(tmp_path)
    args[args.index("--allowed-regions") + 1] = "eu"
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "data-residency" in err and "[region]" in err
    assert not (tmp_path / "out").exists()
