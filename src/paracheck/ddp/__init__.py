"""The DDP family, as a progression: naive -> flat -> overlapped -> bucketed."""

from paracheck.ddp.flat import FlatDDP
from paracheck.ddp.naive import NaiveDDP

__all__ = ["FlatDDP", "NaiveDDP"]
