"""Hardware and model catalogs, and the memory-fit check between them."""

from serving.catalog.fit import FitReport, ModelDoesNotFit, check_fit
from serving.catalog.hardware import HARDWARE, Figure, Hardware, Region, UnknownHardware, get_hardware
from serving.catalog.models import MODELS, ModelSpec, UnknownModel, format_bytes, get_model

__all__ = [
    "HARDWARE",
    "MODELS",
    "Figure",
    "FitReport",
    "Hardware",
    "ModelDoesNotFit",
    "ModelSpec",
    "Region",
    "UnknownHardware",
    "UnknownModel",
    "check_fit",
    "format_bytes",
    "get_hardware",
    "get_model",
]
