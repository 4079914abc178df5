"""Performance model: step latency per operator class, calibrated from measurements."""

from serving.perf.feedback import correct_efficiency
from serving.perf.model import (
    ACCELERATOR_PRIOR,
    Efficiency,
    StepShape,
    StepTime,
    StepTimeModel,
    load_efficiency,
    nearest_measured,
    step_model_for,
)

__all__ = [
    "ACCELERATOR_PRIOR",
    "Efficiency",
    "StepShape",
    "StepTime",
    "StepTimeModel",
    "correct_efficiency",
    "load_efficiency",
    "nearest_measured",
    "step_model_for",
]
