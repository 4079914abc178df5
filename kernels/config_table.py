"""The per-bucket configuration table that `tailguard kernels tune` writes and the wrappers read.

File format (JSON), one object:

    {"schema": 1, "gpu": "NVIDIA H200", "model": {...shapes...}, "date": "...",
     "versions": {...}, "buckets": {...weights the profile gave...},
     "ops": {"<op>": {"<bucket key>": {"config": {...}, "time_us": float,
                                       "candidates": [{"config": {...}, "time_us": float}, ...]}}}}

A deployment carries the file; host wrappers look their bucket up in the table installed with
`use_table` (or named by the TAILGUARD_KERNEL_CONFIG environment variable) and fall back to their
built-in heuristic for a bucket the table lacks, so a partial table is never an error.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
ENV_VAR = "TAILGUARD_KERNEL_CONFIG"


@dataclass(frozen=True)
class ConfigTable:
    # op name -> bucket key -> chosen launch configuration (block sizes, num_warps, num_stages)
    configs: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)

    def lookup(self, op: str, bucket: str) -> dict[str, int] | None:
        return self.configs.get(op, {}).get(bucket)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ConfigTable:
        if data.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"kernel config table: schema {data.get('schema')!r}, expected {SCHEMA_VERSION}")
        ops = data.get("ops", {})
        configs = {
            op: {str(key): dict(entry["config"]) for key, entry in buckets.items()}
            for op, buckets in ops.items()
        }
        return cls(configs=configs)

    @classmethod
    def load(cls, path: str | Path) -> ConfigTable:
        with open(path, encoding="utf-8") as fh:
            return cls.from_json(json.load(fh))


_active: ConfigTable | None = None
_env_loaded = False


def use_table(table: ConfigTable | None) -> None:
    """Install `table` for every later wrapper call in this process (None removes it)."""
    global _active, _env_loaded
    _active = table
    _env_loaded = True


def active_table() -> ConfigTable | None:
    global _active, _env_loaded
    if not _env_loaded:
        _env_loaded = True
        path = os.environ.get(ENV_VAR)
        if path:
            _active = ConfigTable.load(path)
    return _active


def lookup(op: str, bucket: str) -> dict[str, int] | None:
    table = active_table()
    return None if table is None else table.lookup(op, bucket)
