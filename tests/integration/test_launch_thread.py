"""Note [Launching off the autograd thread]: the collectives of BucketedDDP, OverlappedDDP, Zero1
and Zero2 launched from the launcher thread (forced here on gloo, which the check's recorder
otherwise keeps on the calling thread) give the same gradients and parameters, bit for bit, as
launched from the hooks, with a parameter unused on one rank."""

import pytest

JOBS = "tests.integration._launch_jobs"


@pytest.mark.parametrize("kind", ["bucketed", "overlapped", "zero1", "zero2"])
def test_launches_from_the_thread_equal_launches_from_the_hooks(world, kind):
    assert world.run(f"{JOBS}:compare", kind, world_size=3) == [True] * 3
