"""Aerolog: checkpoints (TimeMachine) and, later, the dashboard."""

from __future__ import annotations

from dualtrain.aerolog.optim_state import OptimizerState
from dualtrain.aerolog.time_machine import CheckpointError, Restored, TimeMachine

__all__ = ["CheckpointError", "OptimizerState", "Restored", "TimeMachine"]
