"""Length caps and scaling of the replayed traffic, and the one line every page says about them.

A CPU host cannot replay a 10,000-token prompt at a customer's rate in a trial of reasonable
length, so the replayed lengths may be changed, in one of two stated ways (both job fields):

- **capped**: prompts and outputs longer than a cap are clipped to it (the tail is flattened
  onto the cap; shorter requests are replayed as they were);
- **scaled**: every prompt and output is replayed at `length_scale` times its length (the shape
  of the distribution, its ratios and tail, is kept; every request is shorter). Caps still
  apply to the scaled lengths.

Either changes what is measured: every page, report and JSON states the factor and the caps with
the share of requests they change (counted on the synthesised traffic the trials replay, not
assumed).
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
    length_scale: float = 1.0  # replayed lengths = sample lengths x this, before the caps

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
    requests_affected: int  # scaled or clipped
    line: str  # the sentence pages show
    length_scale: float = 1.0
    requests_scaled: int = 0  # requests whose prompt or output the factor shortened

    @property
    def affected_share(self) -> float:
        return self.requests_affected / self.num_requests if self.num_requests else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "affected_share": round(self.affected_share, 4)}


def caps_effect(
    workload: Path,
    *,
    max_prompt_tokens: int | None,
    max_output_tokens: int | None,
    max_model_len: int,
    length_scale: float = 1.0,
) -> CapsEffect:
    """How many requests of the synthesised workload (Mooncake JSONL) the factor shortened (rows
    carry their sample lengths once scaled) and the caps clip."""
    n = prompts = outputs = either = scaled = 0
    with workload.open() as fh:
        for raw in fh:
            if not raw.strip():
                continue
            row = json.loads(raw)
            n += 1
            il, ol = int(row.get("input_length", 0)), int(row.get("output_length", 0))
            s = il < int(row.get("sample_input_length", il)) or ol < int(row.get("sample_output_length", ol))
            p = max_prompt_tokens is not None and il > max_prompt_tokens
            o = max_output_tokens is not None and ol > max_output_tokens
            prompts += p
            outputs += o
            scaled += s
            either += p or o or s
    return CapsEffect(
        max_prompt_tokens=max_prompt_tokens,
        max_output_tokens=max_output_tokens,
        max_model_len=max_model_len,
        num_requests=n,
        prompts_clipped=prompts,
        outputs_clipped=outputs,
        requests_affected=either,
        line=caps_line(
            max_prompt_tokens,
            max_output_tokens,
            max_model_len,
            n,
            prompts,
            outputs,
            either,
            length_scale=length_scale,
            scaled=scaled,
        ),
        length_scale=length_scale,
        requests_scaled=scaled,
    )


def caps_line(
    max_prompt: int | None,
    max_output: int | None,
    context: int,
    n: int,
    prompts: int,
    outputs: int,
    either: int,
    *,
    length_scale: float = 1.0,
    scaled: int = 0,
) -> str:
    def pct(k: int) -> str:
        return f"{k / n:.0%}" if n else "0%"

    scaling = length_scale != 1.0
    parts = []  # scaled: only the caps that still clip something are named
    if max_prompt is not None and (prompts or not scaling):
        parts.append(f"prompts capped at {max_prompt:,} tokens ({pct(prompts)} of requests clipped)")
    if max_output is not None and (outputs or not scaling):
        parts.append(f"outputs {'capped ' if scaling else ''}at {max_output:,} ({pct(outputs)} clipped)")
    if scaling:
        head = (
            f"Lengths scaled down for this hardware: every prompt and output replayed at {length_scale:g}x "
            f"its sample length, {pct(scaled)} of requests ({scaled:,} of {n:,}) shorter than in the sample"
        )
        if parts:
            head += "; then " + ", ".join(parts)
        return f"{head}. Context {context:,} tokens."
    if not either:
        return f"Replayed at full length: no request exceeds the caps (context {context:,} tokens)."
    return (
        f"Lengths capped for this hardware: {', '.join(parts)}; {pct(either)} of requests "
        f"({either:,} of {n:,}) are replayed shorter than in the sample. Context {context:,} tokens."
    )
