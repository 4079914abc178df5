"""vLLM engine adapter: configuration, validation and a process launcher."""

from serving.engine.config import EngineConfig, InvalidEngineConfig, validate_args, vllm_importable
from serving.engine.launcher import (
    EngineEndpoint,
    EngineLaunchError,
    EngineProcess,
    default_engine_command,
    free_port,
    process_group_members,
    served_models,
    spawn_engine,
    start_engine,
)

__all__ = [
    "EngineConfig",
    "EngineEndpoint",
    "EngineLaunchError",
    "EngineProcess",
    "InvalidEngineConfig",
    "default_engine_command",
    "free_port",
    "process_group_members",
    "served_models",
    "spawn_engine",
    "start_engine",
    "validate_args",
    "vllm_importable",
]
