"""Pure pieces of the measuring code: bandwidth arithmetic, overlap intervals, variant lookup, asv skips."""

import pytest

from paracheck.accounting.cost import bus_bytes, bus_factor
from paracheck.bench.asvtools import require
from paracheck.bench.comm import bus_bandwidth
from paracheck.bench.overlap import hidden_time
from paracheck.bench.variants import available_variants, variant_kind


def test_bus_bandwidth_is_nccl_tests_formula():
    """busbw = 2(W-1)/W x bytes / t: 1 GB in 1 s on 4 ranks is 1.5 GB/s; one rank moves nothing."""
    assert bus_bandwidth(10**9, 1.0, 4) == pytest.approx(1.5e9, rel=1e-15)
    assert bus_bandwidth(10**9, 2.0, 2) == pytest.approx(0.5e9, rel=1e-15)
    assert bus_bandwidth(10**9, 1.0, 1) == 0.0


@pytest.mark.parametrize("seconds", [0.0, -1.0])
def test_bus_bandwidth_refuses_non_positive_time(seconds):
    """A time <= 0 is refused, naming the argument."""
    with pytest.raises(ValueError, match="seconds"):
        bus_bandwidth(1, seconds, 2)


def test_ring_factors_make_reduce_scatter_plus_all_gather_one_all_reduce():
    """(W-1)/W + (W-1)/W = 2(W-1)/W: ZeRO-1's two halves cost one all-reduce per byte."""
    for w in (2, 3, 8):
        assert bus_factor("reduce_scatter", w) + bus_factor("all_gather", w) == pytest.approx(
            bus_factor("all_reduce", w)
        )
    assert bus_factor("broadcast", 4) == 1.0 and bus_factor("barrier", 4) == 0.0


def test_broadcast_costs_its_whole_message_on_more_than_one_rank():
    """Note [Bus bytes]: one broadcast of S bytes costs 0 at W = 1 and S at W = 2 and W = 4 (its
    chain's busiest link carries the whole message), nccl-tests' bus factor 1."""
    assert [bus_bytes("broadcast", 1000, w) for w in (1, 2, 4)] == [0.0, 1000.0, 1000.0]


def test_cost_model_refuses_unknown_kinds_and_world_sizes():
    """A kind without a cost and a world size below 1 are refused, naming the argument."""
    with pytest.raises(ValueError, match="kind='all_gather_object'"):
        bus_factor("all_gather_object", 2)
    with pytest.raises(ValueError, match="world_size=0"):
        bus_bytes("broadcast", 8, 0)


def test_every_recorded_kind_has_a_cost():
    """The recorder's collective kinds are all costed by the one cost model."""
    from paracheck.accounting.record import COLLECTIVE_KINDS

    for kind in COLLECTIVE_KINDS:
        assert bus_factor(kind, 3) >= 0.0


def test_hidden_time_counts_only_covered_communication():
    """Communication [0,10) under compute [2,4) and [3,6) and [8,20): covered 2..6 and 8..10, i.e. 6."""
    assert hidden_time([(0, 10)], [(2, 4), (3, 6), (8, 20)]) == pytest.approx(6.0)
    assert hidden_time([(0, 1), (5, 6)], [(1, 5)]) == 0.0
    assert hidden_time([(0, 4)], [(-1, 9)]) == pytest.approx(4.0)


def test_missing_variants_are_skipped_not_failed():
    """A name that is neither a baseline nor an importable target is dropped from the benchmark grid."""
    assert variant_kind("no-such-variant") is None
    assert available_variants(["flat", "no-such-variant", "torch-ddp"]) == ("flat", "torch-ddp")


def test_default_variants_are_the_ones_the_benchmarks_drive():
    """Every variant listed by default can be built by build_setup: built-in targets of other
    kinds (a training loop) are not listed, so `paracheck memory` and `paracheck bench` with no
    --variants measure every listed one instead of raising on the first loop."""
    from paracheck.bench.variants import DRIVEN_KINDS

    names = available_variants(include_local=True)
    assert {"local", "flat", "bucketed", "torch-ddp", "sharded", "zero1", "zero2"} <= set(names)
    assert {"fsdp", "torch-fsdp"} <= set(names)
    assert not {"loop", "loop-batch-mean"} & set(names)
    assert all(variant_kind(n) in DRIVEN_KINDS for n in names)


def test_asv_setup_skips_what_was_not_measured():
    """require() raises NotImplementedError (asv's skip) for a tier without hardware, a missing point, a failure."""
    with pytest.raises(NotImplementedError, match="no CUDA"):
        require({"skip": "no CUDA device"}, "x")
    with pytest.raises(NotImplementedError, match="not available"):
        require({"missing": {"cpu|zero9": "not available in this commit"}}, "cpu|zero9")
    with pytest.raises(NotImplementedError, match="failed"):
        require({"cpu|flat": {"error": "RuntimeError: boom"}}, "cpu|flat")
    assert require({"cpu|flat": {"median": 1.0}}, "cpu|flat") == {"median": 1.0}


def test_rmsnorm_benchmark_skips_without_a_gpu():
    """The asv GPU tier's RMSNorm benchmark is skipped (NotImplementedError), never failed, on CPU."""
    import torch

    from paracheck.bench.asvtools import measure_rmsnorm

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the benchmark would measure, not skip")
    results = measure_rmsnorm(shapes=[(8, 16)])
    with pytest.raises(NotImplementedError, match="CUDA"):
        require(results, "8|16")
