"""Tuned fused-MoE tables shipped with a Kubernetes endpoint: a ConfigMap the engine pods mount,
with VLLM_TUNED_CONFIG_FOLDER pointing at it; every object proven against the client's models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from serving.engine import EngineConfig, moe_tables
from serving.runner import k8s, k8s_tables
from serving.runner.k8s import EndpointSpec, InvalidEndpointSpec, ModelRef, NoClusterConfigured, render
from serving.runner.k8s_schema import round_trip, validate_manifest
from serving.runner.k8s_tables import ShippedTables, TablesRefused

ENTRY = {
    "BLOCK_SIZE_M": 16,
    "BLOCK_SIZE_N": 64,
    "BLOCK_SIZE_K": 128,
    "GROUP_SIZE_M": 1,
    "num_warps": 4,
    "num_stages": 3,
}
QWEN_TP1 = "E=128,N=768,device_name=NVIDIA_H200.json"


def _tables(name: str = QWEN_TP1, **entries: dict[str, int]) -> ShippedTables:
    table = {"1": ENTRY, "64": ENTRY | {"BLOCK_SIZE_M": 32}, **entries}
    return k8s_tables.tables_from_files({name: json.dumps(table)})


def _spec(**overrides: Any) -> EndpointSpec:
    values: dict[str, Any] = {
        "name": "chat",
        "namespace": "tenant-a",
        "config": EngineConfig(),
        "model": ModelRef(name="qwen3-30b-a3b", path="/models/qwen3-30b-a3b", pvc="weights"),
        "hardware": "h200",
        "region": "us-east-1",
        "allowed_regions": frozenset({"us"}),
        "moe_tables": _tables(),
    }
    values.update(overrides)
    return EndpointSpec(**values)


def _pod_reads_the_tables(template: dict[str, Any], tables: ShippedTables) -> None:
    pod = template["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == k8s_tables.VOLUME_NAME)
    assert volume["configMap"]["name"] == tables.configmap_name("chat")
    # ConfigMap keys cannot hold "=" or ",": each key is projected to vLLM's file name.
    assert {i["path"] for i in volume["configMap"]["items"]} == set(tables.files)
    container = pod["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == k8s_tables.VOLUME_NAME)
    assert mount == {"mountPath": k8s_tables.TABLES_MOUNT, "name": "moe-tables", "readOnly": True}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[moe_tables.ENV_VAR] == k8s_tables.TABLES_MOUNT
    assert template["metadata"]["labels"][k8s_tables.LABEL] == tables.digest


def test_tables_ship_as_a_configmap_the_deployment_mounts(tmp_path: Path) -> None:
    spec = _spec()
    rendered = render(spec)
    assert [o["kind"] for o in rendered.objects] == ["ConfigMap", "Deployment", "Service"]
    cm_data, deployment_data, _ = rendered.objects
    cm = round_trip(cm_data, "V1ConfigMap")
    round_trip(deployment_data, "V1Deployment")
    assert cm.metadata.name == f"chat-moe-{spec.moe_tables.digest}" and cm.immutable
    assert all(key.startswith("table-") for key in cm.data)
    # What the pod reads under vLLM's file name is the table, as vLLM parses it.
    items = deployment_data["spec"]["template"]["spec"]["volumes"][-1]["configMap"]["items"]
    by_path = {i["path"]: cm.data[i["key"]] for i in items}
    assert moe_tables.parse_table(json.loads(by_path[QWEN_TP1])) == {
        1: ENTRY,
        64: ENTRY | {"BLOCK_SIZE_M": 32},
    }
    _pod_reads_the_tables(deployment_data["spec"]["template"], spec.moe_tables)
    assert k8s.write_manifests(rendered, tmp_path)[0].name == "00-configmap.yaml"
    # Without tables nothing changes: two objects, no variable, no volume.
    plain = render(_spec(moe_tables=None))
    assert [o["kind"] for o in plain.objects] == ["Deployment", "Service"]
    assert moe_tables.ENV_VAR not in json.dumps(plain.objects)


def test_new_tables_are_a_new_configmap_and_roll_the_pods() -> None:
    old, new = render(_spec()), render(_spec(moe_tables=_tables(**{"128": ENTRY})))
    assert old.objects[0]["metadata"]["name"] != new.objects[0]["metadata"]["name"]
    old_t, new_t = (r.objects[1]["spec"]["template"] for r in (old, new))
    assert old_t["metadata"]["labels"][k8s_tables.LABEL] != new_t["metadata"]["labels"][k8s_tables.LABEL]
    # Same tables, same digest: re-rendering changes nothing.
    assert render(_spec()).objects == old.objects


def test_every_pod_of_a_multi_node_engine_mounts_them() -> None:
    tables = _tables("E=128,N=48,device_name=NVIDIA_H200.json")
    config = EngineConfig(tensor_parallel_size=16)
    rendered = render(_spec(config=config, moe_tables=tables))
    assert [o["kind"] for o in rendered.objects] == ["ConfigMap", "LeaderWorkerSet", "Service"]
    group = rendered.objects[1]["spec"]["leaderWorkerTemplate"]
    for template in (group["leaderTemplate"], group["workerTemplate"]):
        _pod_reads_the_tables(template, tables)


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"hardware": "h100"}, "is for NVIDIA_H200, and the endpoint runs on NVIDIA_H100_80GB_HBM3"),
        ({"config": EngineConfig(tensor_parallel_size=2)}, "at tensor_parallel_size 2 reads E=128,N=384"),
        (
            {"model": ModelRef(name="llama-3.1-8b", path="/models/l", pvc="weights")},
            "not a mixture-of-experts model",
        ),
        (
            {"config": EngineConfig(extra_env=((moe_tables.ENV_VAR, "/elsewhere"),))},
            "already sets VLLM_TUNED_CONFIG_FOLDER",
        ),
        (
            {"hardware": "mi300x", "region": "eastus", "image": "rocm/vllm:custom"},
            "no vLLM device name is known for mi300x",
        ),
    ],
)
def test_tables_the_engine_should_not_read_are_refused(overrides: dict[str, Any], reason: str) -> None:
    with pytest.raises(InvalidEndpointSpec, match=reason) as err:
        render(_spec(**overrides))
    assert err.value.field == "moe_tables"


def test_bad_tables_are_refused_with_the_file_at_fault(tmp_path: Path) -> None:
    with pytest.raises(TablesRefused, match="not a vLLM fused-MoE table name"):
        k8s_tables.tables_from_files({"tables.json": "{}"})
    with pytest.raises(TablesRefused, match=f"{QWEN_TP1} line 1: not JSON"):
        k8s_tables.tables_from_files({QWEN_TP1: "{"})
    with pytest.raises(TablesRefused, match="BLOCK_SIZE_N must be a power of two"):
        k8s_tables.tables_from_files({QWEN_TP1: {"1": ENTRY | {"BLOCK_SIZE_N": 96}}})
    many = {
        f"E={e},N=768,device_name=NVIDIA_H200.json": {"1": ENTRY} for e in range(1, k8s_tables.MAX_TABLES + 2)
    }
    with pytest.raises(TablesRefused, match="more than 64"):
        k8s_tables.tables_from_files(many)
    with pytest.raises(TablesRefused, match="no tables"):
        k8s_tables.tables_from_files({})
    # A folder written by the tuning step loads as the same tables.
    path = moe_tables.write_table(tmp_path, moe_tables.TableShape(128, 768, "NVIDIA_H200"), {1: ENTRY})
    assert k8s_tables.tables_from_folder(tmp_path).files == {path.name: path.read_text()}
    with pytest.raises(TablesRefused, match="is not a folder"):
        k8s_tables.tables_from_folder(tmp_path / "missing")


def test_apply_knows_configmaps(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent" / "config"))
    monkeypatch.setenv("HOME", str(tmp_path))
    rendered = render(_spec())
    validate_manifest(rendered.objects[0])
    # Every object passes the schema check; what stops it is the missing cluster, not the ConfigMap.
    with pytest.raises(NoClusterConfigured, match="no Kubernetes cluster is configured"):
        k8s.apply(rendered)
