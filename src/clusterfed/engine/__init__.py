"""Batched local training, aggregation and evaluation for many models (DESIGN.md §6)."""

from clusterfed.engine.engine import Engine, Round, Tally, TrainingConfig, Visit, select_device
from clusterfed.engine.stacked import StackedParams

__all__ = ["Engine", "Round", "StackedParams", "Tally", "TrainingConfig", "Visit", "select_device"]
