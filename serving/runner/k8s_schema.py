"""Proof that rendered manifests match the Kubernetes API schema, before anything reaches a cluster.

Built-in kinds go through the official client's own models: the dict is deserialized into the
model class (`V1Deployment`, `V1Service`, ...) and serialized again. The client's deserializer
silently drops keys it does not know and coerces primitives (`"3"` becomes `3`), so the check is
that the round trip gives back exactly the same dict; any difference names the path where the
dict left the schema.

The LeaderWorkerSet is a custom resource the client has no model for. Its pod templates are
ordinary `V1PodTemplateSpec`s and go through the same round trip; its own fields are checked
against `LWS_SCHEMA`, written from the `leaderworkerset.x-k8s.io/v1` Go types
(kubernetes-sigs/lws, `api/leaderworkerset/v1/leaderworkerset_types.go`): field names, required
fields, enums and types.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"


class ManifestSchemaError(ValueError):
    """A rendered object does not match its API schema; `path` is where (e.g. `spec.replicas`)."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


@cache
def _api_client() -> Any:
    from kubernetes.client import ApiClient

    return ApiClient()


@dataclass(frozen=True)
class _Body:
    # The client's `deserialize` reads a response object's `.data`; this is the smallest one.
    data: str


def serialize(model: Any) -> dict[str, Any]:
    """A client model as the JSON-ready dict the API server receives."""
    data: dict[str, Any] = _api_client().sanitize_for_serialization(model)
    return data


def round_trip(data: Mapping[str, Any], model_class: str, *, where: str = "") -> Any:
    """Deserialize `data` into the client's `model_class`; refuse if anything is lost or coerced.

    Returns the model. Raises `ManifestSchemaError` naming the first path that is not in the
    schema or whose value the schema reads differently (a wrong type).
    """
    client = _api_client()
    try:
        model = client.deserialize(_Body(json.dumps(data)), model_class)
    except _DESERIALIZE_ERRORS as exc:
        path = _locate_failure(data, model_class, where)
        raise ManifestSchemaError(
            f"{path or model_class}: not valid in a {model_class}: {exc}", path=path
        ) from exc
    again = client.sanitize_for_serialization(model)
    problem = _first_difference(dict(data), again, where)
    if problem is not None:
        path, message = problem
        raise ManifestSchemaError(f"{path or model_class}: {message} (schema: {model_class})", path=path)
    return model


# What the client's deserializer raises on a value of the wrong shape (int("http"), a list
# where a map belongs) or a missing required field.
_DESERIALIZE_ERRORS = (ValueError, TypeError, AttributeError)


def _deserializes(value: Any, type_name: str) -> bool:
    try:
        _api_client().deserialize(_Body(json.dumps(value)), type_name)
    except _DESERIALIZE_ERRORS:
        return False
    return True


def _locate_failure(data: Any, type_name: str, path: str) -> str:
    """The deepest path under `data` whose value the client cannot deserialize as `type_name`."""
    if type_name.startswith("list[") and isinstance(data, list):
        inner = type_name[5:-1]
        for i, item in enumerate(data):
            if not _deserializes(item, inner):
                return _locate_failure(item, inner, f"{path}[{i}]")
        return path
    from kubernetes.client import models

    model = getattr(models, type_name, None)
    if model is None or not isinstance(data, Mapping):
        return path
    attribute_by_key = {key: attr for attr, key in model.attribute_map.items()}
    for key, value in data.items():
        attr = attribute_by_key.get(key)
        if attr is not None and not _deserializes(value, model.openapi_types[attr]):
            return _locate_failure(value, model.openapi_types[attr], _join(path, key))
    return path  # every field deserializes alone: the object itself misses a required field


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _first_difference(sent: Any, back: Any, path: str) -> tuple[str, str] | None:
    if isinstance(sent, dict) and isinstance(back, dict):
        for key, value in sent.items():
            if key not in back:
                if value is None:
                    continue  # an explicit null and an absent field mean the same to the API
                return _join(path, key), "not a field of the API schema"
            found = _first_difference(value, back[key], _join(path, key))
            if found is not None:
                return found
        extra = sorted(set(back) - set(sent))
        if extra:
            return _join(path, extra[0]), "appeared in the round trip (a wrong type upstream)"
        return None
    if isinstance(sent, list) and isinstance(back, list | tuple):
        if len(sent) != len(back):
            return path, f"list of {len(sent)} came back as {len(back)}"
        for i, (a, b) in enumerate(zip(sent, back, strict=True)):
            found = _first_difference(a, b, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    if type(sent) is not type(back) or sent != back:
        return path, f"{sent!r} is not a valid value here (the schema reads it as {back!r})"
    return None


# -- the LeaderWorkerSet's own fields -------------------------------------------------------------


@dataclass(frozen=True)
class _Field:
    kind: str  # "int", "str", "int_or_str", "enum", "object", "model", "list_model", "const"
    required: bool = False
    minimum: int | None = None  # for "int"
    values: tuple[str, ...] = ()  # for "enum" and "const"
    fields: Mapping[str, _Field] = field(default_factory=dict)  # for "object"
    model: str = ""  # client model class for "model" / "list_model"


def _obj(required: bool = False, **fields: _Field) -> _Field:
    return _Field("object", required=required, fields=fields)


# From leaderworkerset_types.go (LeaderWorkerSetSpec, LeaderWorkerTemplate, RolloutStrategy,
# RollingUpdateConfiguration, SubGroupPolicy, NetworkConfig) and their kubebuilder markers.
LWS_SCHEMA: _Field = _obj(
    required=True,
    apiVersion=_Field("const", required=True, values=(LWS_API_VERSION,)),
    kind=_Field("const", required=True, values=(LWS_KIND,)),
    metadata=_Field("model", required=True, model="V1ObjectMeta"),
    spec=_obj(
        required=True,
        replicas=_Field("int", minimum=0),
        leaderWorkerTemplate=_obj(
            required=True,
            leaderTemplate=_Field("model", model="V1PodTemplateSpec"),
            workerTemplate=_Field("model", required=True, model="V1PodTemplateSpec"),
            size=_Field("int", minimum=1),
            restartPolicy=_Field(
                "enum", values=("Default", "RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None")
            ),
            subGroupPolicy=_obj(
                subGroupPolicyType=_Field("enum", values=("LeaderWorker", "LeaderExcluded")),
                subGroupSize=_Field("int", minimum=1),
            ),
            volumeClaimTemplates=_Field("list_model", model="V1PersistentVolumeClaim"),
            persistentVolumeClaimRetentionPolicy=_Field(
                "model", model="V1StatefulSetPersistentVolumeClaimRetentionPolicy"
            ),
        ),
        rolloutStrategy=_obj(
            type=_Field("enum", required=True, values=("RollingUpdate",)),
            rollingUpdateConfiguration=_obj(
                partition=_Field("int", minimum=0),
                maxUnavailable=_Field("int_or_str"),
                maxSurge=_Field("int_or_str"),
            ),
        ),
        startupPolicy=_Field("enum", values=("LeaderCreated", "LeaderReady")),
        networkConfig=_obj(
            subdomainPolicy=_Field("enum", required=True, values=("Shared", "UniquePerReplica")),
        ),
    ),
)


def validate_leaderworkerset(data: Mapping[str, Any]) -> None:
    """Check a LeaderWorkerSet dict: its fields against `LWS_SCHEMA`, its pod templates by round trip."""
    _check(LWS_SCHEMA, data, "")


def _check(spec: _Field, value: Any, path: str) -> None:
    where = path or "LeaderWorkerSet"
    if spec.kind == "object":
        if not isinstance(value, Mapping):
            raise ManifestSchemaError(f"{where}: expected an object, got {type(value).__name__}", path=path)
        unknown = sorted(set(value) - set(spec.fields))
        if unknown:
            raise ManifestSchemaError(
                f"{_join(path, unknown[0])}: not a field of the LeaderWorkerSet schema",
                path=_join(path, unknown[0]),
            )
        for name, sub in spec.fields.items():
            if name not in value or value[name] is None:
                if sub.required:
                    raise ManifestSchemaError(f"{_join(path, name)}: required", path=_join(path, name))
                continue
            _check(sub, value[name], _join(path, name))
    elif spec.kind == "int":
        # bool is an int subclass in Python but not in the API's JSON schema.
        if not isinstance(value, int) or isinstance(value, bool):
            raise ManifestSchemaError(f"{where}: expected an integer, got {value!r}", path=path)
        if spec.minimum is not None and value < spec.minimum:
            raise ManifestSchemaError(f"{where}: must be >= {spec.minimum}, got {value}", path=path)
    elif spec.kind == "int_or_str":
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ManifestSchemaError(
                f"{where}: expected an integer or a percentage, got {value!r}", path=path
            )
        if isinstance(value, str) and not (value.endswith("%") and value[:-1].isdigit()):
            raise ManifestSchemaError(
                f"{where}: a string must be a percentage like '10%', got {value!r}", path=path
            )
    elif spec.kind in ("enum", "const"):
        if value not in spec.values:
            raise ManifestSchemaError(f"{where}: {value!r} is not one of {', '.join(spec.values)}", path=path)
    elif spec.kind == "model":
        if not isinstance(value, Mapping):
            raise ManifestSchemaError(f"{where}: expected an object, got {type(value).__name__}", path=path)
        round_trip(value, spec.model, where=path)
    elif spec.kind == "list_model":
        if not isinstance(value, list):
            raise ManifestSchemaError(f"{where}: expected a list, got {type(value).__name__}", path=path)
        for i, item in enumerate(value):
            round_trip(item, spec.model, where=f"{path}[{i}]")
    else:  # pragma: no cover - the schema above uses only the kinds handled here
        raise AssertionError(spec.kind)


def validate_manifest(data: Mapping[str, Any]) -> None:
    """Check one rendered object against its schema, chosen by `apiVersion` and `kind`."""
    kind = (data.get("apiVersion"), data.get("kind"))
    model = _BUILT_IN.get(kind)  # type: ignore[arg-type]
    if model is not None:
        round_trip(data, model)
    elif kind == (LWS_API_VERSION, LWS_KIND):
        validate_leaderworkerset(data)
    else:
        raise ManifestSchemaError(f"no schema for apiVersion={kind[0]!r} kind={kind[1]!r}", path="apiVersion")


_BUILT_IN: dict[tuple[str, str], str] = {
    ("apps/v1", "Deployment"): "V1Deployment",
    ("v1", "Service"): "V1Service",
    ("v1", "ConfigMap"): "V1ConfigMap",
}
