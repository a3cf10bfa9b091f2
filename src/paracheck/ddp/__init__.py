"""The DDP family, as a progression: naive -> flat -> overlapped -> bucketed (+ torch's, adapted)."""

from paracheck.ddp.bucketed import BucketedDDP
from paracheck.ddp.flat import FlatDDP
from paracheck.ddp.naive import NaiveDDP
from paracheck.ddp.overlapped import OverlappedDDP
from paracheck.ddp.plan import plan_buckets
from paracheck.ddp.torch_ddp import TorchDDP

__all__ = ["BucketedDDP", "FlatDDP", "NaiveDDP", "OverlappedDDP", "TorchDDP", "plan_buckets"]
