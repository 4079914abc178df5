"""`tailguard endpoint serve`: run one endpoint in the foreground, supervised.

The process owns the router and the engine. It writes its state (status, address, generation,
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

from serving.engine.config import EngineConfig, InvalidEngineConfig
from serving.engine.launcher import EngineLaunchError
from serving.runner.local import LocalEndpoint, RouterError


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
    serve.add_argument("--work-dir", type=Path, required=True, help="logs")
    serve.add_argument("--state-file", type=Path, help="JSON state written after every change")
    serve.add_argument(
        "--api-key-file", type=Path, help="file holding the key clients must send (kept out of argv)"
    )
    serve.add_argument("--check-interval-s", type=float, default=2.0)
    serve.set_defaults(func=_serve)


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
    endpoint = LocalEndpoint(model=args.model, config=config, port=args.port, work_dir=args.work_dir)
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        endpoint.start()
    except (EngineLaunchError, RouterError) as exc:
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
