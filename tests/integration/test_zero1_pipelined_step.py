"""Note [Zero1 step pipelined with its all-gathers]: stepping the pieces run by run of buckets,
each run's all-gathers launched once it is stepped (forced here on gloo; NCCL's choice), gives the
parameters and optimizer state of one step over every piece, bit for bit, with two parameter
groups and pieces without a gradient; a planted overlap of runs (pieces stepped twice) does not."""

import pytest

JOBS = "tests.integration._pipelined_step_jobs"


@pytest.mark.parametrize(
    "kind,optimizer",
    [
        ("zero1", "sgd-momentum"),
        ("zero1", "adam"),
        ("zero1", "adam-foreach"),
        ("zero2", "adamw"),
    ],
)
def test_pipelined_step_equals_one_step(world, kind, optimizer):
    out = world.run(f"{JOBS}:compare", f"{kind}:{optimizer}", world_size=3)
    for r in out:
        assert r["equal"], r
        assert r["runs"] > 1, r  # the case has several runs, so the pipelined path was taken
        assert r["plain_steps"] == 3, r
        # One wrapped step per run with a piece of this rank (a run may have none on one rank).
        assert 3 < r["pipelined_steps"] <= 3 * r["runs"], r


def test_pieces_stepped_twice_are_caught(world):
    out = world.run(f"{JOBS}:compare", "zero1:adam:overlapping-runs", world_size=3)
    assert not all(r["equal"] for r in out), out
