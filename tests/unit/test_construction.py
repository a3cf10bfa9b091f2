"""One construction of a DDP target serves the ranks and the benchmarks: ``construct_ddp`` gives
each argument what its name reads as (Note [Readings of a DDP interface]), and the benchmark's
set-up of a DDP target is built through it."""

from __future__ import annotations

from paracheck.check.construction import MB, construct_ddp

GIVEN = dict(rank=1, world_size=3, process_group="group", device="cpu")


class ByName:
    def __init__(self, module, rank, world_size, *, bucket_cap_mb=25.0, group=None):
        self.args = (module, rank, world_size, bucket_cap_mb, group)


class InBytes:
    def __init__(self, model, bucket_bytes=None, use_async_comm=True):
        self.args = (model, bucket_bytes, use_async_comm)


def test_each_argument_gets_what_its_name_reads_as():
    built = construct_ddp(ByName, "m", path="t:ByName", bucket_mb=0.5, takes_bucket=True, **GIVEN)
    assert built.args == ("m", 1, 3, 0.5, None)  # a group with a default keeps it
    built = construct_ddp(InBytes, "m", path="t:InBytes", bucket_mb=2, takes_bucket=True, **GIVEN)
    assert built.args == ("m", 2 * MB, True)  # bytes where the name says bytes; a default kept
    # One unbounded bucket: None, as given.
    built = construct_ddp(
        InBytes, "m", path="t:InBytes", bucket_mb=None, takes_bucket=True, **GIVEN
    )
    assert built.args == ("m", None, True)


NEEDS_RANK = """
import torch


class NeedsRank(torch.nn.Module):
    def __init__(self, module, rank, world_size, bucket_size_mb=25.0):
        super().__init__()
        self.module, self.args = module, (rank, world_size, bucket_size_mb)

    def forward(self, x):
        return self.module(x)

    def finish_gradient_synchronization(self):
        pass
"""


def test_the_benchmarks_build_a_ddp_target_as_the_ranks_do(tmp_path, monkeypatch):
    """A constructor that takes the rank and world size by name is given them by the benchmark
    too (positionally it would get the bucket size as its rank)."""
    import torch
    import torch.distributed as dist

    from paracheck.bench.variants import build_setup

    path = tmp_path / "needs_rank.py"
    path.write_text(NEEDS_RANK)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 3)
    model = torch.nn.Linear(2, 2)
    setup = build_setup(
        f"{path}:NeedsRank", model, bucket_mb=0.5, device=torch.device("cpu"), process_group="g"
    )
    assert setup.wrapper.module is model and setup.wrapper.args == (1, 3, 0.5)
