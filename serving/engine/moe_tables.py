"""vLLM's tuned fused-MoE tables: their file names, reading them (refusing another device, dtype
or shape), writing them, and the token-count buckets they are keyed by.

vLLM looks a MoE layer's kernel configuration up in a JSON file named
`E=<experts>,N=<intermediate size per shard>,device_name=<GPU>[,dtype=<quant>][,block_shape=[n,k]].json`
(the GPU name with blanks and slashes as `_`, every H200 variant as `NVIDIA_H200`; no dtype part
for bf16/fp16), first in the folder named by `VLLM_TUNED_CONFIG_FOLDER`, then among the tables
it ships. The file is an object keyed by batch size (tokens in the step); for a step of M tokens
vLLM takes the entry whose key is nearest to M (the smaller key on a tie) and launches its Triton
kernel with that entry's `BLOCK_SIZE_M/N/K`, `GROUP_SIZE_M`, `num_warps`, `num_stages`. Without
a file it falls back to a generic heuristic and logs "Performance might be sub-optimal".

N is the width of one shard of one expert's MLP: `moe_intermediate_size / tensor_parallel_size`
(the down projection's input), which is why a tensor-parallel split is a shape of its own.

Pure Python: used where tables are produced (the tuner, with a GPU) and where they are shipped
(runners, which have none).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.engine.config import EngineConfig

ENV_VAR = "VLLM_TUNED_CONFIG_FOLDER"

# The batch sizes vLLM's own tuning script tunes and 288 of the 338 tables vLLM 0.32 ships are
# keyed by: a uniform table has exactly these keys.
BATCH_SIZE_KEYS: tuple[int, ...] = (
    1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096,
)  # fmt: skip
# Keys past vLLM's grid for steps larger than 4096 tokens (long prefills under a large budget).
LARGE_BATCH_SIZE_KEYS: tuple[int, ...] = (6144, 8192, 12288, 16384, 24576, 32768, 49152, 65536)

# The launch parameters of one table entry, with the values vLLM's Triton kernel accepts.
CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
_POW2_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "num_warps")
_LIMITS = {  # inclusive bounds; a larger tile does not fit any GPU's shared memory
    "BLOCK_SIZE_M": (16, 256),
    "BLOCK_SIZE_N": (16, 512),
    "BLOCK_SIZE_K": (16, 512),
    "GROUP_SIZE_M": (1, 256),
    "num_warps": (1, 32),
    "num_stages": (1, 8),
}
MAX_TABLE_KEYS = 256  # entries in one table; vLLM's largest shipped table has 27
MAX_BATCH_SIZE = 1 << 20  # a batch-size key beyond this is not a step any engine runs
MAX_TABLE_BYTES = 256 * 1024  # one table file; vLLM's largest shipped one is ~8 KB
# vLLM's device-name normalisation: every H200 variant reads the NVIDIA_H200 tables.
_H200_FAMILY = "H200"
# Catalog hardware -> the device name vLLM puts in table file names (torch's device name with
# blanks as "_"): what a runner checks shipped tables against.
CATALOG_DEVICE_NAMES: dict[str, str] = {
    "h100": "NVIDIA_H100_80GB_HBM3",
    "h200": "NVIDIA_H200",
    "b200": "NVIDIA_B200",
}
# Common quantisation tags in vLLM's file names (none for bf16/fp16 weights; vLLM also ships
# a few others, e.g. int8_w8a8).
KNOWN_DTYPES = ("fp8_w8a8", "fp8_w8a16", "int8_w8a16", "int4_w4a16", "float32")

_NAME = re.compile(
    r"^E=(?P<E>[1-9]\d*),N=(?P<N>[1-9]\d*),device_name=(?P<device>[^,/\s]+)"
    r"(?:,dtype=(?P<dtype>[a-z0-9_]+))?(?:,block_shape=\[(?P<bn>\d+),(?P<bk>\d+)\])?\.json$"
)


class MoETableError(ValueError):
    """A table that cannot be used as asked; the message says why (and the engine keeps its defaults)."""


def device_file_name(gpu_name: str) -> str:
    """The device part of a table's file name for a GPU as torch names it ("NVIDIA H200" ...)."""
    name = re.sub(r"[\s/]+", "_", gpu_name.strip())
    if not name:
        raise MoETableError("empty GPU name")
    return "NVIDIA_H200" if _H200_FAMILY in name.split("_") else name


@dataclass(frozen=True)
class TableShape:
    """What a table is for: the layer's shape, the device and the weights' number format."""

    num_experts: int  # E: experts in the layer (on this device, with expert parallelism)
    shard_intermediate_size: int  # N: one expert's MLP width on one tensor-parallel shard
    device_name: str  # as in the file name, e.g. "NVIDIA_H200"
    dtype: str | None = None  # None: bf16/fp16 weights; else one of KNOWN_DTYPES
    block_shape: tuple[int, int] | None = None  # block-quantised weights' [n, k] blocks

    def __post_init__(self) -> None:
        if self.num_experts < 1 or self.shard_intermediate_size < 1:
            raise MoETableError(
                f"a MoE table needs experts >= 1 and N >= 1, got E={self.num_experts}, "
                f"N={self.shard_intermediate_size}"
            )
        if not re.fullmatch(r"[^,/\s]+", self.device_name):
            raise MoETableError(f"device name {self.device_name!r} cannot be part of a file name")
        if self.dtype is not None and not re.fullmatch(r"[a-z0-9_]+", self.dtype):
            raise MoETableError(
                f"table dtype {self.dtype!r} is not a vLLM dtype tag (e.g. {', '.join(KNOWN_DTYPES)})"
            )

    @property
    def file_name(self) -> str:
        dtype = f",dtype={self.dtype}" if self.dtype else ""
        block = f",block_shape=[{self.block_shape[0]},{self.block_shape[1]}]" if self.block_shape else ""
        return f"E={self.num_experts},N={self.shard_intermediate_size},device_name={self.device_name}{dtype}{block}.json"

    @classmethod
    def from_file_name(cls, name: str) -> TableShape:
        match = _NAME.match(name)
        if match is None:
            raise MoETableError(
                f"{name!r} is not a vLLM fused-MoE table name "
                "(E=<experts>,N=<intermediate per shard>,device_name=<GPU>[,dtype=...].json)"
            )
        block = (int(match["bn"]), int(match["bk"])) if match["bn"] else None
        return cls(int(match["E"]), int(match["N"]), match["device"], match["dtype"], block)


def shape_for(
    *,
    num_experts: int,
    moe_intermediate_size: int,
    tensor_parallel_size: int,
    gpu_name: str,
    dtype: str | None = None,
) -> TableShape:
    """The table a model's MoE layers read on a deployment (tensor-parallel split included)."""
    if num_experts < 1:
        raise MoETableError("the model is not a mixture of experts (no experts): it reads no MoE table")
    if tensor_parallel_size < 1 or moe_intermediate_size % tensor_parallel_size:
        raise MoETableError(
            f"moe_intermediate_size {moe_intermediate_size} does not split over "
            f"tensor_parallel_size {tensor_parallel_size}"
        )
    return TableShape(
        num_experts,
        moe_intermediate_size // tensor_parallel_size,
        device_file_name(gpu_name),
        dtype,
    )


def check_entry(entry: Any, where: str) -> dict[str, int]:
    """One table entry as vLLM's kernel takes it, or `MoETableError` naming the bad field."""
    if not isinstance(entry, Mapping):
        raise MoETableError(f"{where}: an entry must be an object of {', '.join(CONFIG_KEYS)}")
    missing = [k for k in CONFIG_KEYS if k not in entry]
    if missing:
        raise MoETableError(f"{where}: missing {', '.join(missing)}")
    extra = sorted(set(entry) - set(CONFIG_KEYS) - {"SPLIT_K"})
    if extra:
        raise MoETableError(f"{where}: unknown field(s) {', '.join(extra)}")
    out: dict[str, int] = {}
    for key in CONFIG_KEYS:
        value = entry[key]
        low, high = _LIMITS[key]
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise MoETableError(f"{where}: {key} must be an integer in [{low}, {high}], got {value!r}")
        if key in _POW2_KEYS and value & (value - 1):
            raise MoETableError(f"{where}: {key} must be a power of two, got {value}")
        out[key] = value
    if "SPLIT_K" in entry and entry["SPLIT_K"] != 1:
        raise MoETableError(
            f"{where}: SPLIT_K must be 1 (vLLM's kernel has no split-K), got {entry['SPLIT_K']!r}"
        )
    return out


def parse_table(data: Any, where: str = "table") -> dict[int, dict[str, int]]:
    """A table's JSON (an object keyed by batch size) checked entry by entry."""
    if not isinstance(data, Mapping):
        raise MoETableError(f"{where}: expected an object keyed by batch size")
    table: dict[int, dict[str, int]] = {}
    for key, entry in data.items():
        if key == "triton_version":  # vLLM's tuning script records it; vLLM drops it
            continue
        if not (isinstance(key, str) and key.isdigit()) or not 1 <= int(key) <= MAX_BATCH_SIZE:
            raise MoETableError(f"{where}: key {key!r} is not a batch size in [1, {MAX_BATCH_SIZE}]")
        table[int(key)] = check_entry(entry, f"{where}[{key}]")
    if not table:
        raise MoETableError(f"{where}: no entries")
    if len(table) > MAX_TABLE_KEYS:
        raise MoETableError(f"{where}: {len(table)} entries, more than {MAX_TABLE_KEYS}")
    return dict(sorted(table.items()))


def read_table(path: Path, *, expect: TableShape | None = None) -> dict[int, dict[str, int]]:
    """Read one table file, refusing one for another device, dtype or shape than `expect`."""
    shape = TableShape.from_file_name(path.name)
    if expect is not None:
        problems = []
        if shape.device_name != expect.device_name:
            problems.append(f"device {shape.device_name}, not {expect.device_name}")
        if shape.dtype != expect.dtype:
            problems.append(f"dtype {shape.dtype or 'bf16/fp16'}, not {expect.dtype or 'bf16/fp16'}")
        if shape.block_shape != expect.block_shape:
            problems.append(f"block shape {shape.block_shape}, not {expect.block_shape}")
        if (shape.num_experts, shape.shard_intermediate_size) != (
            expect.num_experts,
            expect.shard_intermediate_size,
        ):
            problems.append(
                f"shape E={shape.num_experts},N={shape.shard_intermediate_size}, not "
                f"E={expect.num_experts},N={expect.shard_intermediate_size}"
            )
        if problems:
            raise MoETableError(
                f"{path.name} is for {'; '.join(problems)}: refused (the engine keeps its defaults)"
            )
    size = path.stat().st_size
    if size > MAX_TABLE_BYTES:
        raise MoETableError(f"{path.name}: {size} bytes, more than {MAX_TABLE_BYTES}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise MoETableError(f"{path.name} line {exc.lineno}: not JSON ({exc.msg})") from exc
    return parse_table(data, path.name)


def table_json(table: Mapping[int, Mapping[str, int]]) -> str:
    """A table in vLLM's format (keys as strings, ascending), checked first."""
    checked = parse_table({str(k): dict(v) for k, v in table.items()})
    return json.dumps({str(k): v for k, v in checked.items()}, indent=4) + "\n"


def write_table(folder: Path, shape: TableShape, table: Mapping[int, Mapping[str, int]]) -> Path:
    """Write `table` where `VLLM_TUNED_CONFIG_FOLDER=folder` makes vLLM read it; returns the path."""
    text = table_json(table)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / shape.file_name
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def read_folder(folder: Path, *, device_name: str | None = None) -> dict[str, dict[int, dict[str, int]]]:
    """Every table in a folder (file name -> table); with `device_name`, one for another device is refused."""
    if not folder.is_dir():
        raise MoETableError(f"{folder} is not a folder of tables")
    out: dict[str, dict[int, dict[str, int]]] = {}
    for path in sorted(folder.iterdir()):
        if path.suffix != ".json":
            continue
        if len(out) >= MAX_TABLE_KEYS:
            raise MoETableError(f"{folder}: more than {MAX_TABLE_KEYS} tables")
        shape = TableShape.from_file_name(path.name)
        expect = None if device_name is None else dataclasses.replace(shape, device_name=device_name)
        out[path.name] = read_table(path, expect=expect)
    if not out:
        raise MoETableError(f"{folder} holds no table (*.json)")
    return out


# -- buckets -------------------------------------------------------------------------------------


def nearest_key(keys: Iterable[int], num_tokens: int) -> int:
    """The entry vLLM uses for a step of `num_tokens` tokens: the nearest key, the smaller on a tie."""
    ordered = sorted(keys)
    if not ordered:
        raise MoETableError("a table without keys")
    return min(ordered, key=lambda k: abs(k - num_tokens))


@dataclass(frozen=True)
class Bucket:
    """The steps one table entry serves, as the traffic runs them."""

    key: int  # batch-size key of the entry
    steps: int  # engine steps whose token count maps to this key
    seconds: float  # time those steps took (simulated or measured)
    weight: float  # share of all steps' time: what a faster entry saves, relatively
    # the token counts seen in this bucket with their share of the bucket's time, heaviest first
    # (at most `max_points`); a tuner times the entry's candidates at these
    points: tuple[tuple[int, float], ...]


def bucket_steps(
    step_tokens: Mapping[int, tuple[int, float]],
    *,
    keys: Iterable[int] | None = None,
    max_points: int = 4,
) -> list[Bucket]:
    """Group a step histogram (tokens -> (steps, seconds)) by the table key vLLM would use.

    Weights are shares of time, not of steps: a bucket of long prefill steps that runs rarely
    can weigh more than frequent short decode steps, and time is what latency is made of.
    The default keys are vLLM's grid, extended past 4096 (by 1.5x and 2x steps) as far as the
    largest step seen: a grid ending at 4096 would serve an 8192-token prefill step with the
    4096 entry.
    """
    if not 1 <= max_points <= 64:
        raise ValueError(f"max_points must be in [1, 64], got {max_points}")
    if keys is None:
        largest = max((t for t, (c, _) in step_tokens.items() if c > 0), default=1)
        keys = [*BATCH_SIZE_KEYS, *(k for k in LARGE_BATCH_SIZE_KEYS if k <= 1.25 * largest)]
    key_list = sorted(set(keys))
    if not key_list or key_list[0] < 1:
        raise ValueError("keys must be positive batch sizes")
    per_key: dict[int, dict[int, list[float]]] = {}
    total_s = 0.0
    for tokens, (steps, seconds) in step_tokens.items():
        if tokens < 1 or steps < 0 or not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"step histogram: bad entry {tokens} -> ({steps}, {seconds})")
        if steps == 0:
            continue
        entry = per_key.setdefault(nearest_key(key_list, tokens), {}).setdefault(tokens, [0.0, 0.0])
        entry[0] += steps
        entry[1] += seconds
        total_s += seconds
    if total_s <= 0:
        raise ValueError("step histogram: no step took any time")
    buckets = []
    for key, counts in sorted(per_key.items()):
        seconds = sum(s for _, s in counts.values())
        heaviest = sorted(counts.items(), key=lambda kv: (-kv[1][1], kv[0]))[:max_points]
        kept = sum(s for _, (_, s) in heaviest) or 1.0
        buckets.append(
            Bucket(
                key=key,
                steps=int(sum(c for c, _ in counts.values())),
                seconds=seconds,
                weight=seconds / total_s,
                points=tuple((tokens, s / kept) for tokens, (_, s) in heaviest),
            )
        )
    return buckets


# -- shipping with an engine -------------------------------------------------------------------


def with_tables(config: EngineConfig, folder: str) -> EngineConfig:
    """`config` with vLLM pointed at a folder of tables (through `extra_env`, replacing any earlier folder)."""
    if not folder or not folder.startswith("/"):
        raise MoETableError(f"the tables folder must be an absolute path on the engine host, got {folder!r}")
    env = (*((k, v) for k, v in config.extra_env if k != ENV_VAR), (ENV_VAR, folder))
    return dataclasses.replace(config, extra_env=env)


def tables_folder(config: EngineConfig) -> str | None:
    """The tables folder a configuration points vLLM at, if any."""
    return dict(config.extra_env).get(ENV_VAR)
