"""A failure on some ranks fails every rank at once, instead of leaving the others in the next
collective until the process-group timeout.

Found by running the mutant suite at world sizes 3 and 4: ``zero1-state-dict-local`` (state_dict
without the other ranks' state) made the ranks that own no state raise while reading the
consolidated state, and the owner went on to the next step's collectives and hung there. Every
shrink step then cost the timeout: 77.6 s to kill the mutant on gloo at world sizes 3,4 (and over
250 s on NCCL with its 60 s timeout), 4.9 s since the ranks agree on failure.
"""

from dataclasses import replace

import pytest

from paracheck.cases import Case
from paracheck.check.ranks import RankJob
from paracheck.world import RankError, World

# A case the mutant suite generated at world size 4 (a group added at step 1, an unused layer):
# the ranks that own no state for some parameter raise while reading the state_dict, rank 2
# did not and used to hang in step 1's collectives.
CASE = Case.from_json("""{"model": {"kind": "mlp", "in_features": 1, "widths": [2, 1],
 "bias": false, "frozen": [], "tied": false, "unused": "always", "buffer": true},
 "world_size": 4, "batch_sizes": [2, 2, 2, 1], "steps": 2, "accumulation": 3, "no_sync": true,
 "optimizer": {"name": "adamw", "groups": [{"params": [0, 2], "lr": 0.01, "weight_decay": 0.1,
 "momentum": 0.0, "betas": [0.8, 0.99], "add_at_step": null}, {"params": [1], "lr": 0.01,
 "weight_decay": 0.1, "momentum": 0.0, "betas": [0.9, 0.999], "add_at_step": 1}],
 "lr_decay": 1.0, "as_generator": false}, "bucket_size_mb": 9.5367431640625e-06, "seed": 26596,
 "rank_dependent_init": false, "set_to_none": true, "dtype": "float32", "merged_ranks": 1}""")


@pytest.mark.world_size(4)
def test_state_dict_bug_on_some_ranks_raises_on_every_rank():
    """The mutant's run fails as raised on all 4 ranks (none hung), the real cause first."""
    job = RankJob(case=CASE, path="paracheck.mutants.sharding:Zero1LocalStateDict", kind="zero")
    with World(4, timeout=20.0) as world:
        with pytest.raises(RankError) as info:
            world.run("paracheck.check.ranks.zero:run_zero", job, world_size=4)
        failures = info.value.failures
        assert sorted(f.rank for f in failures) == [0, 1, 2, 3]
        assert all(f.kind == "raised" for f in failures)
        assert "another rank" not in failures[0].detail  # a rank with the real error first
        # The same world runs the correct class afterwards: nobody was left in a collective.
        ok = world.run(
            "paracheck.check.ranks.zero:run_zero",
            replace(job, path="paracheck.zero:Zero1"),
            world_size=4,
        )
        assert len(ok) == 4
