"""Locally built random-weight models of real architectures (no downloads)."""

from serving.models.tiny import ARCHITECTURES, SIZES, ModelShape, TinyModel, build_tiny_model, describe_size

__all__ = ["ARCHITECTURES", "SIZES", "ModelShape", "TinyModel", "build_tiny_model", "describe_size"]
