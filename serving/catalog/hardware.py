"""Hardware catalog: accelerators a customer can choose, with every figure's source and date.

Each number is a `Figure` carrying where it comes from. Figures read from a vendor or cloud page
found in this project's reference search are `confirmed=True` and name that page; figures that
could not be checked from here say so in `source` and are `confirmed=False` (never a made-up
citation). Throughput is dense (no 2:4 sparsity); where a page quoted only sparse figures, the
source says the value was halved. Prices are indicative list prices per device-hour; admins
override them in the portal.

The local CPU's figures are measured on this machine by `serving.perf.calibrate` and stored in
`serving/perf/data/local_cpu.json`; the catalog reads them from there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

RETRIEVED = "2026-11-30"  # when the pages below were read through the reference search
_CPU_DATA = Path(__file__).resolve().parent.parent / "perf" / "data" / "local_cpu.json"
# Where the machine Tailguard runs on is, as a residency code. "local" (the default) is allowed
# only by organizations that allow "local"; a deployment in a US data centre sets
# LOCAL_HARDWARE_REGION=us, and then a US-only organization can tune and serve on this machine.
LOCAL_REGION_ENV = "LOCAL_HARDWARE_REGION"


def local_region_code() -> str:
    """The residency code of this machine (environment variable LOCAL_HARDWARE_REGION)."""
    return os.environ.get(LOCAL_REGION_ENV, "").strip().lower() or "local"


@dataclass(frozen=True)
class Figure:
    """One datasheet number with its provenance."""

    value: float
    unit: str  # e.g. "TFLOPS", "GB", "GB/s", "USD/h"
    source: str  # page name and URL as text, or why it is unconfirmed
    as_of: str  # date of the source (YYYY-MM-DD or YYYY-MM) or of its retrieval
    confirmed: bool  # False: not checked against a source from this project


@dataclass(frozen=True)
class Region:
    """Where a cloud offers the device; `code` is what data-residency policies match on."""

    provider: str  # "gcp", "aws", "azure", "oci", "neocloud", "local"
    name: str  # provider's region/zone name, e.g. "europe-west4-a"
    code: str  # residency code: "us", "eu", "asia", "local"
    source: str
    confirmed: bool


@dataclass(frozen=True)
class Hardware:
    """One accelerator (per device figures)."""

    name: str  # catalog key, e.g. "h200"
    display_name: str
    vendor: str
    kind: str  # "gpu", "tpu", "trainium", "cpu"
    memory_gb: Figure  # device memory (GB = 1e9 bytes unless the unit says GiB)
    memory_bandwidth_gbps: Figure  # GB/s
    # Dense matrix throughput by format ("bf16", "fp8", "fp4"); a missing key: no native support.
    dense_tflops: dict[str, Figure] = field(repr=False)
    interconnect: str  # scale-up link name
    interconnect_gbps: Figure  # per-device scale-up bandwidth, GB/s (bidirectional as quoted)
    engines: tuple[str, ...]  # serving engines that support it
    regions: tuple[Region, ...] = field(repr=False)
    price_per_hour_usd: Figure = field(repr=False)
    max_devices_per_node: int = 8

    @property
    def memory_bytes(self) -> float:
        factor = 2**30 if self.memory_gb.unit == "GiB" else 1e9
        return self.memory_gb.value * factor

    @property
    def memory_bandwidth_bytes_per_s(self) -> float:
        return self.memory_bandwidth_gbps.value * 1e9

    def peak_flops(self, fmt: str) -> float:
        """Dense FLOP/s in `fmt`; falls back to the nearest wider format the device has."""
        for candidate in _FORMAT_FALLBACK[fmt]:
            figure = self.dense_tflops.get(candidate)
            if figure is not None:
                return figure.value * 1e12
        raise KeyError(f"{self.name} has no throughput figure for {fmt}")

    def region_codes(self) -> set[str]:
        return {r.code for r in self.regions}

    def figures(self) -> dict[str, Figure]:
        """Every figure by a dotted name (for listing sources)."""
        out = {
            "memory_gb": self.memory_gb,
            "memory_bandwidth_gbps": self.memory_bandwidth_gbps,
            "interconnect_gbps": self.interconnect_gbps,
            "price_per_hour_usd": self.price_per_hour_usd,
        }
        out.update({f"dense_tflops.{k}": v for k, v in self.dense_tflops.items()})
        return out


_FORMAT_FALLBACK: dict[str, tuple[str, ...]] = {
    "fp32": ("fp32", "bf16"),
    "bf16": ("bf16", "fp32"),
    "fp16": ("bf16", "fp32"),
    "fp8": ("fp8", "bf16", "fp32"),
    "int8": ("fp8", "bf16", "fp32"),
    "fp4": ("fp4", "fp8", "bf16", "fp32"),
}


def _f(value: float, unit: str, source: str, as_of: str = RETRIEVED, confirmed: bool = True) -> Figure:
    return Figure(value=value, unit=unit, source=source, as_of=as_of, confirmed=confirmed)


def _unconfirmed(value: float, unit: str, what: str) -> Figure:
    return Figure(
        value=value,
        unit=unit,
        source=f"UNCONFIRMED: {what}; no vendor page for it was reachable from this project's search",
        as_of=RETRIEVED,
        confirmed=False,
    )


def _price(value: float, note: str) -> Figure:
    return _unconfirmed(value, "USD/h", f"indicative on-demand price per device-hour ({note})")


def _regions(
    provider: str, items: tuple[tuple[str, str], ...], source: str, confirmed: bool
) -> tuple[Region, ...]:
    return tuple(Region(provider, name, code, source, confirmed) for name, code in items)


_H200_PAGE = "NVIDIA H200 datasheet figures as quoted (dense) at https://itkb.uw.cz/2026/06/nvidia-h200-vs-b300-precisions-cores.html"
_H100_PAGE = "NVIDIA H100 SXM datasheet figures as quoted at https://lzwjava.github.io/nvidia-h200-gpu-specs-en and https://www.host360.ai/blog/blog-h100-h200-b200-gpu-benchmarks-pricing-guide-2026"
_HGX_PAGE = "NVIDIA HGX B200/B300 platform table (8-GPU totals divided by 8; sparse halved) at https://fibermall.com/blog/?p=17161"
_B200_PAGE = "NVIDIA HGX B200 hardware overview, https://docs.vultr.com/inference-cookbook/cuda/getting-started/hardware-overview (updated 2026-03-11)"
_B300_PAGE = "NVIDIA HGX B300 per-GPU figures at https://glennklockwood.com/garden/processors/B300 (another page, itkb.uw.cz, quotes higher dense figures: conflicting)"
_MI300X_PAGE = "AMD Instinct MI300X figures at https://www.jaredwatkins.com/research/ai-accelerators/amd-instinct/mi300-series/ and https://aiwiki.ai/wiki/amd_instinct_mi300x"
_MI355X_PAGE = "AMD Instinct MI355X: 288 GB / 8 TB/s at https://www.tomshardware.com/pc-components/gpus/amds-instinct-mi355x-accelerator-will-consume-1-400-watts"
_TPU_PAGE = "Google Cloud 'TPU v6e' spec table, https://docs.cloud.google.com/tpu/docs/v6e"
_TPU_REGIONS = "Google Cloud 'TPU regions and zones', https://cloud.google.com/tpu/docs/regions-zones"
_TRN2_PAGE = (
    "AWS Neuron 'Trainium2 Architecture', "
    "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.29.0/_sources/about-neuron/arch/neuron-hardware/trainium2.rst"
)
_TRN2_NKI = (
    "AWS Neuron 'Trainium2 Architecture Guide for NKI' (96 GiB, 3 TB/s), "
    "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.29.0/_sources/nki/guides/architecture/trainium2_arch.rst"
)
_GPU_ENGINES = ("vllm", "sglang", "tensorrt-llm")
_ROCM_ENGINES = ("vllm", "sglang")
_UNCONF_REGIONS = "UNCONFIRMED: region list not checked against the provider's page"


_CLOUD: dict[str, Hardware] = {
    "h100": Hardware(
        name="h100",
        display_name="NVIDIA H100 SXM 80GB",
        vendor="nvidia",
        kind="gpu",
        memory_gb=_f(80, "GB", _H100_PAGE),
        memory_bandwidth_gbps=_f(3350, "GB/s", _H100_PAGE),
        dense_tflops={
            "bf16": _f(
                989,
                "TFLOPS",
                "NVIDIA H100 SXM: 989 dense BF16, as quoted at https://www.mercatus-ai.com/blog/a100-vs-h100-vs-h200",
            ),
            "fp8": _f(1979, "TFLOPS", _H100_PAGE + " (3,958 with sparsity, halved)"),
        },
        interconnect="NVLink 4",
        interconnect_gbps=_f(900, "GB/s", _H100_PAGE),
        engines=_GPU_ENGINES,
        regions=_regions(
            "aws", (("us-east-1", "us"), ("us-west-2", "us"), ("eu-north-1", "eu")), _UNCONF_REGIONS, False
        )
        + _regions(
            "gcp",
            (("us-central1", "us"), ("europe-west4", "eu"), ("asia-southeast1", "asia")),
            _UNCONF_REGIONS,
            False,
        ),
        price_per_hour_usd=_f(
            2.50,
            "USD/h",
            "H100 cloud on-demand 2026, https://www.host360.ai/blog/blog-h100-h200-b200-gpu-benchmarks-pricing-guide-2026",
            "2026",
        ),
    ),
    "h200": Hardware(
        name="h200",
        display_name="NVIDIA H200 SXM 141GB",
        vendor="nvidia",
        kind="gpu",
        memory_gb=_f(141, "GB", _H200_PAGE),
        memory_bandwidth_gbps=_f(4800, "GB/s", _H200_PAGE),
        dense_tflops={
            "bf16": _f(989, "TFLOPS", _H200_PAGE, "2026-06-22"),
            "fp8": _f(1979, "TFLOPS", _H200_PAGE, "2026-06-22"),
        },
        interconnect="NVLink 4",
        interconnect_gbps=_f(900, "GB/s", _H200_PAGE, "2026-06-22"),
        engines=_GPU_ENGINES,
        regions=_regions("aws", (("us-east-1", "us"), ("eu-west-1", "eu")), _UNCONF_REGIONS, False)
        + _regions("azure", (("eastus2", "us"), ("swedencentral", "eu")), _UNCONF_REGIONS, False),
        price_per_hour_usd=_f(
            4.54,
            "USD/h",
            "Spheron on-demand H200 price, https://www.spheron.network/blog/nvidia-h200-vs-b200-vs-gb200",
            "2026-03-17",
        ),
    ),
    "b200": Hardware(
        name="b200",
        display_name="NVIDIA B200 (HGX) 180GB",
        vendor="nvidia",
        kind="gpu",
        memory_gb=_f(179, "GB", _B200_PAGE, "2026-03-11"),
        memory_bandwidth_gbps=_f(8000, "GB/s", _B200_PAGE, "2026-03-11"),
        dense_tflops={
            "bf16": _f(2250, "TFLOPS", _HGX_PAGE + " (36 PF sparse / 8 / 2)"),
            "fp8": _f(4500, "TFLOPS", _HGX_PAGE + " (72 PF sparse / 8 / 2); ~4.5 PF also at " + _B200_PAGE),
            "fp4": _f(9000, "TFLOPS", _HGX_PAGE + " (72 PF dense / 8)"),
        },
        interconnect="NVLink 5",
        interconnect_gbps=_f(1800, "GB/s", _B200_PAGE, "2026-03-11"),
        engines=_GPU_ENGINES,
        regions=_regions("neocloud", (("us-east", "us"), ("eu-central", "eu")), _UNCONF_REGIONS, False),
        price_per_hour_usd=_f(
            6.03,
            "USD/h",
            "Spheron on-demand B200 price, https://www.spheron.network/blog/nvidia-h200-vs-b200-vs-gb200",
            "2026-03-17",
        ),
    ),
    "b300": Hardware(
        name="b300",
        display_name="NVIDIA B300 Blackwell Ultra (HGX) 288GB",
        vendor="nvidia",
        kind="gpu",
        memory_gb=_f(288, "GB", _B300_PAGE),
        memory_bandwidth_gbps=_f(8000, "GB/s", _B300_PAGE),
        dense_tflops={
            "bf16": _f(2250, "TFLOPS", _B300_PAGE),
            "fp8": _f(4500, "TFLOPS", _B300_PAGE),
            "fp4": _f(13125, "TFLOPS", _B300_PAGE),
        },
        interconnect="NVLink 5",
        interconnect_gbps=_f(
            1800,
            "GB/s",
            "NVIDIA HGX B300 spec table at https://acecloud.ai/blog/nvidia-hgx-b300",
            "2026-02-23",
        ),
        engines=_GPU_ENGINES,
        regions=_regions("neocloud", (("us-east", "us"), ("eu-central", "eu")), _UNCONF_REGIONS, False),
        price_per_hour_usd=_price(8.00, "B300 rental rates not found; estimated above B200"),
    ),
    "mi300x": Hardware(
        name="mi300x",
        display_name="AMD Instinct MI300X 192GB",
        vendor="amd",
        kind="gpu",
        memory_gb=_f(192, "GB", _MI300X_PAGE),
        memory_bandwidth_gbps=_f(5300, "GB/s", _MI300X_PAGE),
        dense_tflops={
            "bf16": _f(1307, "TFLOPS", _MI300X_PAGE + " (~1.3 PFLOPS FP16)"),
            "fp8": _f(
                2615,
                "TFLOPS",
                _MI300X_PAGE + " (~2.6 PFLOPS FP8)",
            ),
        },
        interconnect="Infinity Fabric (xGMI 3)",
        interconnect_gbps=_f(
            896, "GB/s", "https://gpu.blog/gpus/instinct-mi300x-mi300x (xGMI 896 GB/s)", "2025-01-01"
        ),
        engines=_ROCM_ENGINES,
        regions=_regions("azure", (("eastus", "us"), ("westeurope", "eu")), _UNCONF_REGIONS, False),
        price_per_hour_usd=_f(
            1.71, "USD/h", "TensorWave on-demand, https://gpu.blog/gpus/instinct-mi300x-mi300x", "2025-01-01"
        ),
    ),
    "mi355x": Hardware(
        name="mi355x",
        display_name="AMD Instinct MI355X 288GB",
        vendor="amd",
        kind="gpu",
        memory_gb=_f(288, "GB", _MI355X_PAGE, "2025-06"),
        memory_bandwidth_gbps=_f(8000, "GB/s", _MI355X_PAGE, "2025-06"),
        dense_tflops={
            "bf16": _unconfirmed(2500, "TFLOPS", "MI355X dense BF16 (~half of dense FP8)"),
            "fp8": _f(
                5000,
                "TFLOPS",
                "AMD ISSCC 2026 MI355X talk: ~5 PFLOPS FP8 (dense vs sparse not stated there), "
                "https://www.world-today-news.com/?p=7253162",
                "2026-02-16",
            ),
            "fp4": _unconfirmed(
                10050,
                "TFLOPS",
                "MI355X dense FP4: half of the 20.1 PFLOPS FP4/FP6 maximum quoted by tomshardware.com, "
                "assuming that maximum is with sparsity (another page calls ~10 PFLOPS the sparse figure)",
            ),
        },
        interconnect="Infinity Fabric 4",
        interconnect_gbps=_unconfirmed(1075, "GB/s", "MI355X Infinity Fabric aggregate bandwidth"),
        engines=_ROCM_ENGINES,
        regions=_regions(
            "oci",
            (("us-ashburn-1", "us"), ("eu-frankfurt-1", "eu")),
            "OCI is the first MI355X cloud (https://aiwiki.ai/wiki/amd_instinct_mi355x); regions UNCONFIRMED",
            False,
        ),
        price_per_hour_usd=_price(3.00, "MI355X"),
    ),
    "tpu-v6e": Hardware(
        name="tpu-v6e",
        display_name="Google Cloud TPU v6e (Trillium)",
        vendor="google",
        kind="tpu",
        memory_gb=_f(32, "GB", _TPU_PAGE),
        memory_bandwidth_gbps=_f(1638, "GB/s", _TPU_PAGE),
        dense_tflops={"bf16": _f(918, "TFLOPS", _TPU_PAGE)},  # int8 1836 TOPS; no fp8 figure
        interconnect="ICI (2D torus)",
        interconnect_gbps=_f(800, "GB/s", _TPU_PAGE),
        engines=("vllm-tpu", "jetstream"),
        regions=_regions(
            "gcp",
            (("us-central1-b", "us"), ("us-east1-d", "us"), ("us-east5-a", "us"), ("europe-west4-a", "eu")),
            _TPU_REGIONS,
            True,
        ),
        price_per_hour_usd=_price(2.70, "Cloud TPU v6e on-demand per chip-hour"),
    ),
    "trainium2": Hardware(
        name="trainium2",
        display_name="AWS Trainium2",
        vendor="aws",
        kind="trainium",
        memory_gb=_f(96, "GiB", _TRN2_NKI, "2025-12-01"),
        memory_bandwidth_gbps=_f(3000, "GB/s", _TRN2_NKI, "2025-12-01"),
        dense_tflops={
            "bf16": _f(667, "TFLOPS", _TRN2_PAGE),
            "fp8": _f(1299, "TFLOPS", _TRN2_PAGE),
        },
        interconnect="NeuronLink-v3",
        interconnect_gbps=_unconfirmed(1024, "GB/s", "Trainium2 NeuronLink-v3 bandwidth per chip"),
        engines=("vllm-neuron", "neuronx-distributed-inference"),
        regions=_regions("aws", (("us-east-2", "us"), ("us-west-2", "us")), _UNCONF_REGIONS, False),
        price_per_hour_usd=_price(2.90, "trn2.48xlarge on-demand divided by its 16 chips"),
        max_devices_per_node=16,
    ),
}


def _local_cpu() -> Hardware:
    data: dict[str, object] = {}
    if _CPU_DATA.exists():
        data = json.loads(_CPU_DATA.read_text())
    hw = data.get("hardware", {}) if isinstance(data.get("hardware"), dict) else {}
    assert isinstance(hw, dict)
    measured_on = str(data.get("measured_at", RETRIEVED))[:10]
    how = "measured on this machine by serving.perf.calibrate (" + str(data.get("machine", "local CPU")) + ")"

    def measured(key: str, default: float, unit: str) -> Figure:
        if key in hw:
            return Figure(float(hw[key]), unit, how, measured_on, True)
        return _unconfirmed(default, unit, f"local CPU {key} (not measured yet)")

    return Hardware(
        name="local-cpu",
        display_name="This machine's CPU (vLLM CPU build)",
        vendor="local",
        kind="cpu",
        memory_gb=measured("memory_gb", 8.0, "GB"),
        memory_bandwidth_gbps=measured("memory_bandwidth_gbps", 10.0, "GB/s"),
        dense_tflops={
            "fp32": measured("fp32_tflops", 0.1, "TFLOPS"),
            "bf16": measured("bf16_tflops", 0.03, "TFLOPS"),
        },
        interconnect="none",
        interconnect_gbps=Figure(0.0, "GB/s", "single CPU socket: no scale-up link", RETRIEVED, True),
        engines=("vllm-cpu",),
        regions=(
            Region(
                "local",
                "this machine",
                "local",  # completed with LOCAL_HARDWARE_REGION whenever the entry is read (_Catalog)
                f"the machine Tailguard runs on (its residency code: {LOCAL_REGION_ENV})",
                True,
            ),
        ),
        # Not priced: the operator's own machine has no rental price, and a price only it knows.
        # 0 stands for "none" here (cost per token ties at 0 and never ranks configurations); an
        # admin's price in the portal's catalog, 0 included ("free"), is a price.
        price_per_hour_usd=Figure(
            0.0,
            "USD/h",
            "own machine: no rental price (not priced unless an admin sets one)",
            RETRIEVED,
            True,
        ),
        max_devices_per_node=1,
    )


class _Catalog(Mapping[str, Hardware]):
    """The catalog by name. This machine's entry is completed when it is read: its region's
    residency code is the deployment's (LOCAL_HARDWARE_REGION) at that moment, never a value
    frozen when the module was imported."""

    def __init__(self, entries: Mapping[str, Hardware]) -> None:
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> Hardware:
        hardware = self._entries[name]
        if hardware.vendor != "local":
            return hardware
        code = local_region_code()
        return replace(hardware, regions=tuple(replace(r, code=code) for r in hardware.regions))

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


HARDWARE: Mapping[str, Hardware] = _Catalog({**_CLOUD, "local-cpu": _local_cpu()})


class UnknownHardware(KeyError):
    """No catalog entry by that name; the message lists the known ones."""


def get_hardware(name: str) -> Hardware:
    key = name.strip().lower().replace("_", "-")
    aliases = {"cpu": "local-cpu", "local": "local-cpu", "v6e": "tpu-v6e", "trn2": "trainium2"}
    key = aliases.get(key, key)
    if key not in HARDWARE:
        raise UnknownHardware(f"unknown hardware {name!r}; known: {', '.join(sorted(HARDWARE))}")
    return HARDWARE[key]


def hardware_in_regions(codes: set[str]) -> list[Hardware]:
    """Hardware offered in at least one region whose residency code is in `codes`."""
    return [hw for hw in HARDWARE.values() if hw.region_codes() & codes]
