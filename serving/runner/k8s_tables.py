"""Tuned fused-MoE tables shipped with a Kubernetes endpoint.

The tables (vLLM's own files, `serving.engine.moe_tables`) travel as one ConfigMap of the
endpoint, mounted read-only into every engine pod at `TABLES_MOUNT`, with
`VLLM_TUNED_CONFIG_FOLDER` pointing there. The ConfigMap's name carries a digest of the tables,
and the pod template a label with it: a promotion that changes the tables is a new ConfigMap
and a rolling update, and the old pods keep reading the tables they started with.

ConfigMap keys may hold only letters, digits, `-`, `_` and `.`, and vLLM's file names hold `=`
and `,`: the data is stored under `table-<n>.json` and each key is projected to its vLLM file
name by the volume's `items`.

Refused before anything is rendered, with the reason: tables for another device than the
endpoint's hardware, for another expert count or tensor-parallel split than the catalog model's,
tables for a model that is not MoE, more than a ConfigMap can hold, and a configuration that
already points vLLM at some other folder.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serving.catalog.models import ModelSpec
from serving.engine import moe_tables
from serving.engine.config import EngineConfig
from serving.runner.k8s_schema import round_trip, serialize

TABLES_MOUNT = "/etc/tailguard/moe-tables"
VOLUME_NAME = "moe-tables"
LABEL = "tailguard.io/moe-tables"  # on pod templates: the digest of the tables they read
# Kubernetes refuses a ConfigMap over 1 MiB (data and metadata together); keep a margin.
MAX_CONFIGMAP_BYTES = 900 * 1024
MAX_TABLES = 64


class TablesRefused(ValueError):
    """The tables cannot ship with this endpoint; the engine would run vLLM's defaults instead."""


@dataclass(frozen=True)
class ShippedTables:
    """The tables of one endpoint revision, checked and in canonical form."""

    files: Mapping[str, str] = field(repr=False)  # vLLM file name -> table JSON
    digest: str  # first 12 hex digits of the SHA-256 over names and contents

    @property
    def shapes(self) -> list[moe_tables.TableShape]:
        return [moe_tables.TableShape.from_file_name(name) for name in self.files]

    def configmap_name(self, endpoint: str) -> str:
        return f"{endpoint}-moe-{self.digest}"


def tables_from_files(files: Mapping[str, str | Mapping[str, Any]]) -> ShippedTables:
    """Check each (file name, table) pair and freeze them; refuses with the file at fault."""
    if not files:
        raise TablesRefused("no tables given")
    if len(files) > MAX_TABLES:
        raise TablesRefused(f"{len(files)} tables, more than {MAX_TABLES}")
    canonical: dict[str, str] = {}
    for name in sorted(files):
        content = files[name]
        try:
            moe_tables.TableShape.from_file_name(name)
            data = json.loads(content) if isinstance(content, str) else content
            canonical[name] = moe_tables.table_json(moe_tables.parse_table(data, name))
        except json.JSONDecodeError as exc:
            raise TablesRefused(f"{name} line {exc.lineno}: not JSON ({exc.msg})") from exc
        except moe_tables.MoETableError as exc:
            raise TablesRefused(str(exc)) from exc
    size = sum(len(k) + len(v.encode()) for k, v in canonical.items())
    if size > MAX_CONFIGMAP_BYTES:
        raise TablesRefused(
            f"the tables take {size} bytes, more than a ConfigMap holds ({MAX_CONFIGMAP_BYTES})"
        )
    h = hashlib.sha256()
    for name, text in canonical.items():
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    return ShippedTables(canonical, h.hexdigest()[:12])


def tables_from_folder(folder: Path) -> ShippedTables:
    """The `*.json` tables of a folder (what the tuning step wrote)."""
    try:
        tables = moe_tables.read_folder(folder)
    except moe_tables.MoETableError as exc:
        raise TablesRefused(str(exc)) from exc
    return tables_from_files({name: {str(k): v for k, v in t.items()} for name, t in tables.items()})


def check_tables(
    tables: ShippedTables,
    *,
    hardware: str,
    model: ModelSpec | None,
    config: EngineConfig,
) -> None:
    """Refuse tables the endpoint's engine would not (or should not) read."""
    device = moe_tables.CATALOG_DEVICE_NAMES.get(hardware)
    if device is None:
        known = ", ".join(sorted(moe_tables.CATALOG_DEVICE_NAMES))
        raise TablesRefused(f"no vLLM device name is known for {hardware} (tables ship for {known})")
    if moe_tables.tables_folder(config) is not None:
        raise TablesRefused(
            f"config.extra_env already sets {moe_tables.ENV_VAR}; the runner points it at the shipped tables"
        )
    for shape in tables.shapes:
        if shape.device_name != device:
            raise TablesRefused(
                f"{shape.file_name} is for {shape.device_name}, and the endpoint runs on {device}"
            )
        if model is None:
            continue
        if not model.is_moe:
            raise TablesRefused(f"{model.name} is not a mixture-of-experts model: it reads no MoE table")
        tp = config.tensor_parallel_size
        expected = (model.num_experts, model.moe_intermediate_size // tp)
        if (shape.num_experts, shape.shard_intermediate_size) != expected:
            raise TablesRefused(
                f"{shape.file_name} is for E={shape.num_experts},N={shape.shard_intermediate_size}; "
                f"{model.name} at tensor_parallel_size {tp} reads E={expected[0]},N={expected[1]}"
            )


def configmap(
    tables: ShippedTables, *, endpoint: str, namespace: str, labels: Mapping[str, str]
) -> dict[str, Any]:
    """The ConfigMap holding the tables, checked against the API schema."""
    from kubernetes import client

    obj = client.V1ConfigMap(
        api_version="v1",
        kind="ConfigMap",
        metadata=client.V1ObjectMeta(
            name=tables.configmap_name(endpoint), namespace=namespace, labels={**labels, LABEL: tables.digest}
        ),
        data={_key(i): text for i, text in enumerate(tables.files.values())},
        immutable=True,  # a revision's tables never change; new tables are a new ConfigMap
    )
    data = serialize(obj)
    round_trip(data, "V1ConfigMap")
    return data


def mount(template: Any, tables: ShippedTables, *, endpoint: str) -> None:
    """Mount the tables into a pod template (a `V1PodTemplateSpec`) and point vLLM at them."""
    from kubernetes import client

    pod = template.spec
    pod.volumes = [
        *(pod.volumes or []),
        client.V1Volume(
            name=VOLUME_NAME,
            config_map=client.V1ConfigMapVolumeSource(
                name=tables.configmap_name(endpoint),
                items=[client.V1KeyToPath(key=_key(i), path=name) for i, name in enumerate(tables.files)],
                optional=False,
            ),
        ),
    ]
    # The engine's containers only (an edge proxy beside them has no use for the tables).
    for container in (c for c in pod.containers if c.name != "edge"):
        container.volume_mounts = [
            *(container.volume_mounts or []),
            client.V1VolumeMount(name=VOLUME_NAME, mount_path=TABLES_MOUNT, read_only=True),
        ]
        container.env = [*(container.env or []), client.V1EnvVar(name=moe_tables.ENV_VAR, value=TABLES_MOUNT)]
    template.metadata.labels = {**(template.metadata.labels or {}), LABEL: tables.digest}


def _key(index: int) -> str:
    return f"table-{index}.json"
