"""Length caps on the replayed traffic, and the one line every page says about them.

A CPU host cannot replay a 10,000-token prompt at a customer's rate in a trial of reasonable
length, so the replayed prompts and outputs may be capped. A cap changes what is measured: the
job records it as a field, and every page, report and JSON states it with the share of requests
it clips (measured on the synthesised traffic the trials replay, not assumed).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Caps:
    max_prompt_tokens: int | None  # None: replayed at full length
    max_output_tokens: int | None
    max_model_len: int  # the engine's context

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CapsEffect:
    max_prompt_tokens: int | None
    max_output_tokens: int | None
    max_model_len: int
    num_requests: int
    prompts_clipped: int  # requests whose prompt is longer than the cap
    outputs_clipped: int
    requests_affected: int  # either clipped
    line: str  # the sentence pages show

    @property
    def affected_share(self) -> float:
        return self.requests_affected / self.num_requests if self.num_requests else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "affected_share": round(self.affected_share, 4)}


def caps_effect(
    workload: Path, *, max_prompt_tokens: int | None, max_output_tokens: int | None, max_model_len: int
) -> CapsEffect:
    """How many requests of the synthesised workload (Mooncake JSONL) the caps clip."""
    n = prompts = outputs = either = 0
    with workload.open() as fh:
        for raw in fh:
            if not raw.strip():
                continue
            row = json.loads(raw)
            n += 1
            p = max_prompt_tokens is not None and int(row.get("input_length", 0)) > max_prompt_tokens
            o = max_output_tokens is not None and int(row.get("output_length", 0)) > max_output_tokens
            prompts += p
            outputs += o
            either += p or o
    return CapsEffect(
        max_prompt_tokens=max_prompt_tokens,
        max_output_tokens=max_output_tokens,
        max_model_len=max_model_len,
        num_requests=n,
        prompts_clipped=prompts,
        outputs_clipped=outputs,
        requests_affected=either,
        line=caps_line(max_prompt_tokens, max_output_tokens, max_model_len, n, prompts, outputs, either),
    )


def caps_line(
    max_prompt: int | None,
    max_output: int | None,
    context: int,
    n: int,
    prompts: int,
    outputs: int,
    either: int,
) -> str:
    def pct(k: int) -> str:
        return f"{k / n:.0%}" if n else "0%"

    if not either:
        return f"Replayed at full length: no request exceeds the caps (context {context:,} tokens)."
    parts = []
    if max_prompt is not None:
        parts.append(f"prompts capped at {max_prompt:,} tokens ({pct(prompts)} of requests clipped)")
    if max_output is not None:
        parts.append(f"outputs at {max_output:,} ({pct(outputs)} clipped)")
    return (
        f"Lengths capped for this hardware: {', '.join(parts)}; {pct(either)} of requests "
        f"({either:,} of {n:,}) are replayed shorter than in the sample. Context {context:,} tokens."
    )
