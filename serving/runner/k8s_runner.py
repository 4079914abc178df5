"""The Kubernetes runner: the endpoint runner protocol over the rendered manifests.

`start` keeps the key in a Secret (the manifests only reference it), renders the endpoint
(`serving.runner.k8s.render`: placement checked against residency, the catalog and the model's
fit) and server-side applies it; `apply_config` renders again with the new configuration and
applies (the Deployment rolls its pods; readiness gates the switch); `stop` deletes the
workload, Service and Secret; `state` reads the workload's ready replicas; `metrics_window`
scrapes the engine through its Service, which answers only from inside the cluster (the portal's
workers then run there too, or an agent of the pool does).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from serving.engine.config import EngineConfig, InvalidEngineConfig
from serving.runner import k8s, k8s_edge, k8s_tables
from serving.runner.base import (
    EndpointLaunch,
    MetricsReading,
    MetricsWindow,
    RunnerError,
    RunnerHandle,
    RunnerState,
    window_between,
)

KIND = "kubernetes"
API_KEY_FIELD = "api-key"


def object_name(endpoint_id: str) -> str:
    """A DNS label from the endpoint's id (letters first, within the renderer's length limit)."""
    return f"tg-{endpoint_id.replace('-', '')[:16]}"


@dataclass(frozen=True)
class ClusterTarget:
    """Where a pool's endpoints go on its cluster."""

    namespace: str
    hardware: str  # catalog hardware name, e.g. "h200"
    region: str  # provider region as the catalog lists it
    allowed_regions: frozenset[str]  # the organization's residency codes
    kubeconfig: str | None = None  # None: in-cluster, $KUBECONFIG or ~/.kube/config
    model_pvc: str | None = None
    image: str | None = None
    timeout_s: float = 30.0
    # An image with Tailguard installed, for the SLA's measuring proxy beside each engine; without
    # one the endpoint is not measured at the edge (its SLA report shows no edge figures).
    edge_image: str | None = None


class KubernetesRunner:
    kind = KIND

    def __init__(self, target: ClusterTarget) -> None:
        self.target = target

    def _configuration(self) -> Any:
        try:
            return k8s.load_cluster_config(self.target.kubeconfig)
        except k8s.NoClusterConfigured as exc:
            raise RunnerError(str(exc)) from exc

    def _edge(self, name: str, launch: EndpointLaunch) -> k8s_edge.EdgeSidecar | None:
        """The measuring proxy, where the portal asked for edge measurements and the target has an
        image for it; the token is in the endpoint's Secret, beside its key."""
        if not (launch.edge_ingest_url and launch.edge_ingest_token and self.target.edge_image):
            return None
        return k8s_edge.EdgeSidecar(
            ingest_url=launch.edge_ingest_url,
            endpoint_id=launch.endpoint_id,
            image=self.target.edge_image,
            token_secret=f"{name}-key",
        )

    def _render(
        self,
        name: str,
        model: str,
        config: dict[str, Any],
        edge: k8s_edge.EdgeSidecar | None = None,
        moe_tables: dict[str, str] | None = None,
    ) -> k8s.RenderedEndpoint:
        try:
            # The revision's tables: a ConfigMap mounted into the pods (serving.runner.k8s_tables).
            tables = k8s_tables.tables_from_files(moe_tables) if moe_tables else None
            spec = k8s.EndpointSpec(
                name=name,
                namespace=self.target.namespace,
                config=EngineConfig.from_mapping(config),
                model=k8s.ModelRef(name=Path(model).name or model, path=model, pvc=self.target.model_pvc),
                hardware=self.target.hardware,
                region=self.target.region,
                allowed_regions=self.target.allowed_regions,
                image=self.target.image,
                api_key_secret=f"{name}-key",
                api_key_secret_key=API_KEY_FIELD,
                edge=edge,
                moe_tables=tables,
            )
            return k8s.render(spec)
        except (
            InvalidEngineConfig,
            k8s.K8sRenderError,
            k8s.ManifestSchemaError,
            k8s_tables.TablesRefused,
        ) as exc:
            field = getattr(exc, "field", None) or getattr(exc, "path", None)
            raise RunnerError(f"{exc}" + (f" [{field}]" if field else "")) from exc

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        configuration = self._configuration()
        with client.ApiClient(configuration) as api:
            try:
                return api.call_api(
                    path,
                    method,
                    header_params={"Content-Type": "application/json", "Accept": "application/json"},
                    body=body,
                    auth_settings=["BearerToken"],
                    response_types_map={200: "object", 201: "object", 202: "object"},
                    _return_http_data_only=True,
                    _request_timeout=self.target.timeout_s,
                )
            except ApiException as exc:
                if exc.status == 404 and method in {"DELETE", "GET"}:
                    return None
                raise RunnerError(
                    f"{method} {path}: the API server refused it ({exc.status} {exc.reason})"
                ) from exc
            except HTTPError as exc:
                raise RunnerError(f"could not reach the API server at {configuration.host}: {exc}") from exc

    def _secret_path(self, name: str) -> str:
        return f"/api/v1/namespaces/{self.target.namespace}/secrets/{name}-key"

    def start(self, launch: EndpointLaunch) -> RunnerHandle:
        name = object_name(launch.endpoint_id)
        edge = self._edge(name, launch)
        # Refused before anything is sent.
        rendered = self._render(name, launch.model, launch.config, edge, launch.moe_tables)
        data = {API_KEY_FIELD: base64.b64encode(launch.api_key.encode()).decode()}
        if edge is not None:
            data[edge.token_secret_key] = base64.b64encode(launch.edge_ingest_token.encode()).decode()
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"{name}-key", "namespace": self.target.namespace},
            "type": "Opaque",
            "data": data,
        }
        if self._call("GET", self._secret_path(name)) is None:
            self._call("POST", f"/api/v1/namespaces/{self.target.namespace}/secrets", secret)
        else:
            self._call("PUT", self._secret_path(name), secret)
        try:
            k8s.apply(rendered, self.target.kubeconfig, timeout_s=self.target.timeout_s)
        except (k8s.NoClusterConfigured, k8s.ApplyFailed) as exc:
            raise RunnerError(str(exc)) from exc
        return RunnerHandle(
            kind=KIND,
            data={
                "namespace": self.target.namespace,
                "name": name,
                "workload": rendered.workload_kind,
                "model": launch.model,
                # A new configuration keeps the sidecar (the token stays in the Secret).
                "edge": None
                if edge is None
                else {"ingest_url": edge.ingest_url, "image": edge.image, "endpoint_id": edge.endpoint_id},
            },
        )

    def apply_config(
        self, handle: RunnerHandle, config: dict[str, Any], *, moe_tables: dict[str, str] | None = None
    ) -> bool:
        name, edge_data = str(handle.data["name"]), handle.data.get("edge")
        edge = None
        if isinstance(edge_data, dict):
            edge = k8s_edge.EdgeSidecar(
                ingest_url=str(edge_data["ingest_url"]),
                endpoint_id=str(edge_data["endpoint_id"]),
                image=str(edge_data["image"]),
                token_secret=f"{name}-key",
            )
        rendered = self._render(name, str(handle.data["model"]), config, edge, moe_tables)
        try:
            k8s.apply(rendered, self.target.kubeconfig, timeout_s=self.target.timeout_s)
        except (k8s.NoClusterConfigured, k8s.ApplyFailed) as exc:
            raise RunnerError(str(exc)) from exc
        return True

    def _workload_path(self, handle: RunnerHandle) -> str:
        name, namespace = handle.data["name"], handle.data["namespace"]
        if handle.data.get("workload") == k8s.LWS_KIND:
            return f"/apis/{k8s.LWS_API_VERSION}/namespaces/{namespace}/leaderworkersets/{name}"
        return f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"

    def stop(self, handle: RunnerHandle, *, timeout_s: float = 60.0) -> None:
        name, namespace = handle.data["name"], handle.data["namespace"]
        self._call("DELETE", self._workload_path(handle))
        self._call("DELETE", f"/api/v1/namespaces/{namespace}/services/{name}")
        self._call("DELETE", f"/api/v1/namespaces/{namespace}/secrets/{name}-key")

    def state(self, handle: RunnerHandle) -> RunnerState:
        workload = self._call("GET", self._workload_path(handle))
        if workload is None:
            return RunnerState(status="stopped", detail="the workload is not on the cluster")
        spec, status = workload.get("spec") or {}, workload.get("status") or {}
        wanted = int(spec.get("replicas") or 1)
        ready = int(status.get("readyReplicas") or 0)
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        progressing = conditions.get("Progressing") or {}
        if progressing.get("reason") == "ProgressDeadlineExceeded":
            return RunnerState(status="failed", detail=str(progressing.get("message") or ""))
        engine_url = f"http://{handle.data['name']}.{handle.data['namespace']}.svc:{k8s.ENGINE_PORT}"
        if ready >= wanted:
            return RunnerState(status="healthy", engine_url=engine_url, raw=status)
        return RunnerState(
            status="starting" if ready == 0 else "degraded",
            detail=f"{ready} of {wanted} replicas ready",
            engine_url=engine_url,
            raw=status,
        )

    def metrics_window(
        self, handle: RunnerHandle, previous: MetricsReading | None, *, timeout_s: float = 5.0
    ) -> MetricsWindow:
        url = f"http://{handle.data['name']}.{handle.data['namespace']}.svc:{k8s.ENGINE_PORT}/metrics"
        try:
            response = httpx.get(url, timeout=timeout_s)
            response.raise_for_status()
            return window_between(previous, response.text)
        except (httpx.HTTPError, ValueError) as exc:
            raise RunnerError(f"metrics unavailable: {type(exc).__name__}") from exc
