"""`tailguard endpoint serve`: run one endpoint in the foreground, supervised.

The process owns the router and the engine (and, with `--edge-ingest-url`, the measuring proxy
in front of them, which then holds `--port`). It writes its state (status, address, generation,
restarts) to `--state-file` after every change, and re-deploys without failing a request when
`--config` changes on disk (the portal writes a new configuration there to promote one).
SIGTERM or SIGINT stops everything.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from serving.edge import IngestTarget
from serving.engine.config import EngineConfig, InvalidEngineConfig
from serving.engine.launcher import EngineLaunchError
from serving.runner.local import EdgeProxyError, LocalEndpoint, RouterError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    endpoint = subparsers.add_parser("endpoint", help="run dedicated endpoints")
    sub = endpoint.add_subparsers(dest="endpoint_command", metavar="ACTION", required=True)
    serve = sub.add_parser(
        "serve",
        help="serve a model behind a stable address, restarting on crashes and re-deploying on config changes",
    )
    serve.add_argument("--model", required=True, help="model directory")
    serve.add_argument(
        "--config", required=True, type=Path, help="engine config (.json/.toml); watched for changes"
    )
    serve.add_argument("--port", type=int, required=True, help="the stable port clients use")
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address the router listens on (0.0.0.0 behind a proxy or firewall)",
    )
    serve.add_argument("--work-dir", type=Path, required=True, help="logs")
    serve.add_argument("--state-file", type=Path, help="JSON state written after every change")
    serve.add_argument(
        "--api-key-file", type=Path, help="file holding the key clients must send (kept out of argv)"
    )
    serve.add_argument("--check-interval-s", type=float, default=2.0)
    serve.add_argument(
        "--edge-ingest-url",
        help="the portal's SLA ingest (…/sla/edge/): a measuring proxy then takes --port, in front of the router",
    )
    serve.add_argument("--edge-endpoint-id", help="the portal's id of this endpoint (with --edge-ingest-url)")
    serve.add_argument(
        "--edge-token-file", type=Path, help="file holding the ingest's token (kept out of argv)"
    )
    serve.set_defaults(func=_serve)
    _register_render_k8s(sub)
    _register_agent(subparsers)


def _register_agent(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    agent = subparsers.add_parser(
        "agent",
        help="run this machine as an engine host of a hardware pool (a Celery worker on the pool's queue)",
    )
    agent.add_argument("--pool", required=True, help="the pool this host serves (its queue is pool.NAME)")
    agent.add_argument("--name", help="this host's name in the pool (default: the host name)")
    agent.add_argument(
        "--engine-command",
        help="how this host starts vLLM (shell words; default TAILGUARD_ENGINE_COMMAND or this Python's "
        "vLLM), e.g. a GPU host's CUDA build",
    )
    agent.add_argument("--loglevel", default="INFO")
    agent.set_defaults(func=_agent)


def _agent(args: argparse.Namespace) -> int:
    """The agent is the portal's Celery worker (it runs the portal's tasks against its database
    and broker), so it runs as the portal's own process: this library hands over to it with the
    same arguments instead of importing the Django side (the layers forbid that)."""
    command = [sys.executable, "-m", "portal.pools.agent", "--pool", args.pool, "--loglevel", args.loglevel]
    if args.name:
        command += ["--name", args.name]
    if args.engine_command:
        command += ["--engine-command", args.engine_command]
    os.execv(command[0], command)  # noqa: S606 (a fixed argv: this Python, a module, parsed arguments)
    return 0  # not reached: execv replaces this process


def _load(path: Path, api_key: str | None) -> EngineConfig:
    config = EngineConfig.from_file(path)
    if api_key:
        from dataclasses import replace

        config = replace(config, api_key=api_key)
    return config


def _write_state(path: Path | None, endpoint: LocalEndpoint, **extra: object) -> None:
    if path is None:
        return
    state = {
        "status": endpoint.state.status,
        "base_url": endpoint.base_url,
        "engine_url": endpoint.engine.base_url if endpoint.engine else None,
        # The engine's process (and process group) id, for operators and fault tests.
        "engine_pid": endpoint.engine.engine_pid if endpoint.engine else None,
        "generation": endpoint.state.generation,
        "restarts": len(endpoint.state.restarts),
        "last_error": endpoint.state.last_error[-2000:],
        "config": endpoint.config.to_mapping(),
        "pid": os.getpid(),
        "updated_at": time.time(),
        **extra,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(path)


def _serve(args: argparse.Namespace) -> int:
    # The portal finds this process by the line below (it is started detached, via setsid).
    print(f"[tailguard-endpoint] pid {os.getpid()}", flush=True)
    api_key = args.api_key_file.read_text().strip() if args.api_key_file else None
    try:
        config = _load(args.config, api_key)
    except InvalidEngineConfig as exc:
        print(f"tailguard endpoint serve: {exc}", file=sys.stderr)
        return 1
    edge = None
    if args.edge_ingest_url:
        if not args.edge_endpoint_id or not args.edge_token_file:
            print(
                "tailguard endpoint serve: --edge-ingest-url needs --edge-endpoint-id and --edge-token-file",
                file=sys.stderr,
            )
            return 2
        edge = IngestTarget(
            url=args.edge_ingest_url,
            endpoint_id=args.edge_endpoint_id,
            token=args.edge_token_file.read_text().strip(),
        )
    endpoint = LocalEndpoint(
        model=args.model, config=config, port=args.port, work_dir=args.work_dir, host=args.host, edge=edge
    )
    # A crash is reported as it is found, not once the replacement engine is up a minute later.
    endpoint.on_change = lambda: _write_state(args.state_file, endpoint)
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        endpoint.start()
    except (EngineLaunchError, RouterError, EdgeProxyError) as exc:
        endpoint.stop()
        endpoint.state.last_error = str(exc)
        _write_state(args.state_file, endpoint, status="failed")
        print(f"tailguard endpoint serve: {exc}", file=sys.stderr)
        return 1
    seen = args.config.stat().st_mtime_ns
    _write_state(args.state_file, endpoint)
    try:
        while not stopping:
            time.sleep(args.check_interval_s)
            mtime = args.config.stat().st_mtime_ns
            if mtime != seen:
                seen = mtime
                try:
                    endpoint.deploy(_load(args.config, api_key))
                except (InvalidEngineConfig, EngineLaunchError, RouterError) as exc:
                    # The running configuration keeps serving; the failure is reported.
                    endpoint.state.last_error = f"re-deployment failed, previous configuration kept: {exc}"
            endpoint.check()
            _write_state(args.state_file, endpoint)
    finally:
        endpoint.stop()
        _write_state(args.state_file, endpoint)
    return 0


# -- Kubernetes ----------------------------------------------------------------------------------


def _register_render_k8s(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    k8s = sub.add_parser(
        "render-k8s",
        help="write the Kubernetes manifests of one endpoint (Deployment or LeaderWorkerSet, Service); --apply sends them",
    )
    k8s.add_argument(
        "--name", required=True, help="endpoint name (a DNS label): names and labels every object"
    )
    k8s.add_argument("--namespace", default="default")
    k8s.add_argument(
        "--model", required=True, help="served model name; a catalog name also checks that it fits"
    )
    k8s.add_argument(
        "--model-path",
        required=True,
        help="--model inside the pod: an absolute path (image or claim) or a URI",
    )
    k8s.add_argument(
        "--model-pvc", help="PersistentVolumeClaim with the weights, mounted read-only at /models"
    )
    k8s.add_argument("--catalog-model", help="catalog model for the fit check when --model is not one")
    k8s.add_argument("--hardware", required=True, help="catalog hardware name, e.g. h200, mi300x, tpu-v6e")
    k8s.add_argument(
        "--region", required=True, help="provider region as the catalog lists it, e.g. us-east-1"
    )
    k8s.add_argument(
        "--allowed-regions",
        required=True,
        help="the organization's allowed regions, comma-separated residency codes (us,eu) or region names",
    )
    k8s.add_argument("--config", required=True, type=Path, help="engine config (.json/.toml)")
    k8s.add_argument("--replicas", type=int, default=1)
    k8s.add_argument("--image", help="vLLM image (default: the official CUDA image for NVIDIA hardware)")
    k8s.add_argument(
        "--api-key-secret", help="Secret holding the endpoint's API key (key: --api-key-secret-key)"
    )
    k8s.add_argument("--api-key-secret-key", default="api-key")
    k8s.add_argument("--startup-timeout-s", type=int, default=1800, help="start-up allowance of the probes")
    k8s.add_argument("--out", required=True, type=Path, help="directory for the YAML files")
    k8s.add_argument("--apply", action="store_true", help="server-side apply to the configured cluster")
    k8s.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig file (default: in-cluster, $KUBECONFIG, ~/.kube/config)"
    )
    k8s.set_defaults(func=_render_k8s)


def _render_k8s(args: argparse.Namespace) -> int:
    # Imported here: the Kubernetes client is large, and the other commands do not need it.
    from serving.runner import k8s

    try:
        spec = k8s.EndpointSpec(
            name=args.name,
            namespace=args.namespace,
            config=EngineConfig.from_file(args.config),
            model=k8s.ModelRef(
                name=args.model, path=args.model_path, pvc=args.model_pvc, catalog_name=args.catalog_model
            ),
            hardware=args.hardware,
            region=args.region,
            allowed_regions=k8s.allowed_regions_from(args.allowed_regions),
            replicas=args.replicas,
            image=args.image,
            api_key_secret=args.api_key_secret,
            api_key_secret_key=args.api_key_secret_key,
            startup_timeout_s=args.startup_timeout_s,
        )
        rendered = k8s.render(spec)
    except (OSError, InvalidEngineConfig, k8s.K8sRenderError, k8s.ManifestSchemaError) as exc:
        field = getattr(exc, "field", None) or getattr(exc, "flag", None)
        print(f"tailguard endpoint render-k8s: {exc}" + (f" [{field}]" if field else ""), file=sys.stderr)
        return 1
    plan = rendered.placement
    print(
        f"{rendered.workload_kind} {args.namespace}/{args.name}: {args.replicas} x "
        f"({plan.num_nodes} node(s) x {plan.devices_per_node} {plan.hardware.name}) in {plan.region.name}"
    )
    for path in k8s.write_manifests(rendered, args.out):
        print(path)
    if not args.apply:
        return 0
    try:
        k8s.apply(rendered, args.kubeconfig)
    except (k8s.NoClusterConfigured, k8s.ApplyFailed) as exc:
        print(f"tailguard endpoint render-k8s: not applied: {exc}", file=sys.stderr)
        return 1
    print(f"applied {len(rendered.objects)} object(s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m serving.runner.cli endpoint ...`: the endpoint commands without the rest of the
    CLI (how the local runner starts a supervisor)."""
    parser = argparse.ArgumentParser(prog="tailguard")
    register(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    args = parser.parse_args(argv)
    status: int = args.func(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
