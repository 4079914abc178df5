"""Learn the workload: read traffic samples, profile them, detect drift, synthesize traffic.

The API the portal and the CLI use:

- `ingest(stream, trace_format="auto", salt=..., limits=IngestLimits(...)) -> IngestResult`
  (`.profile`: `WorkloadProfile`, `.charts`: `ChartData`); raises `TraceError`.
- `WorkloadProfile.to_json_dict()` / `from_json_dict()`: the stored / printed form.
- `drift_report(old_profile, new_profile) -> DriftReport`.
- `synthesize(result, target_rps=..., duration_s=..., rng=np.random.default_rng(seed))`, then
  `write_mooncake_jsonl(trace, stream)`.
"""

from tuning.workload.charts import ChartData
from tuning.workload.columns import BlockStructure, RequestColumns, ReuseCurve
from tuning.workload.drift import DimensionDrift, DriftReport, drift_report
from tuning.workload.errors import TraceError
from tuning.workload.formats import FORMATS, TraceFormat
from tuning.workload.ingest import IngestLimits, IngestResult, ingest, ingest_path
from tuning.workload.profile import ArrivalStats, LengthStats, PrefixStats, WorkloadProfile
from tuning.workload.synth import SyntheticTrace, synthesize, write_mooncake_jsonl
from tuning.workload.tokenizer import ApproxTokenizer, HuggingFaceTokenizer, Tokenizer

__all__ = [
    "FORMATS",
    "ApproxTokenizer",
    "ArrivalStats",
    "BlockStructure",
    "ChartData",
    "DimensionDrift",
    "DriftReport",
    "HuggingFaceTokenizer",
    "IngestLimits",
    "IngestResult",
    "LengthStats",
    "PrefixStats",
    "RequestColumns",
    "ReuseCurve",
    "SyntheticTrace",
    "Tokenizer",
    "TraceError",
    "TraceFormat",
    "WorkloadProfile",
    "drift_report",
    "ingest",
    "ingest_path",
    "synthesize",
    "write_mooncake_jsonl",
]
