"""Attribution lines for reports whose traffic is a public trace (see data/traces/TRACES.md).

Published traces must keep their attribution in any report that shows results on them; a
prospect's own upload needs none beyond saying whose traffic it is.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TraceAttribution:
    title: str
    source: str  # publisher and where in their repository
    url: str
    licence: str


PUBLIC_TRACES: dict[str, TraceAttribution] = {
    "azure2023_conv": TraceAttribution(
        title="Azure LLM inference trace 2023, conversation service",
        source="Azure/AzurePublicDataset, data/AzureLLMInferenceTrace_conv.csv",
        url="https://github.com/Azure/AzurePublicDataset",
        licence="CC-BY 4.0",
    ),
    "mooncake_synthetic": TraceAttribution(
        title="Mooncake FAST'25 release, synthetic trace",
        source="kvcache-ai/Mooncake, FAST25-release/traces/synthetic_trace.jsonl",
        url="https://github.com/kvcache-ai/Mooncake",
        licence="Apache-2.0 (repository licence)",
    ),
}


def attribution_for(traffic_source: str) -> TraceAttribution | None:
    """The attribution a report must show, or None for the prospect's own traffic."""
    return PUBLIC_TRACES.get(traffic_source)
