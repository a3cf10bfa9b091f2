"""A target's ``RankJob`` carries what its rank program reads, through pickle as the World sends it."""

import pickle
from dataclasses import replace

import pytest

from paracheck.cases import Case
from paracheck.check.ranks import RankJob
from paracheck.check.targets import Target


def test_target_job_survives_pickle():
    """The job of a stubbed DDP target equals itself after a pickle round trip, stub included."""
    target = Target("t", "paracheck.ddp:BucketedDDP", "ddp", takes_bucket=True, finish="sync")
    job = replace(target, stub_cuda_timing=True).job(Case(), device="cpu")
    again = pickle.loads(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))
    assert again == job
    assert (again.path, again.kind, again.device) == ("paracheck.ddp:BucketedDDP", "ddp", "cpu")
    assert again.takes_bucket and again.finish == "sync" and again.batch_start is None
    assert again.stubbed == "paracheck.check.ranks.ddp:run_ddp"
    assert target.job(Case()).stubbed is None


def test_job_without_a_needed_field_is_refused_by_name():
    """A reload job without its gradients is refused naming the field."""
    job = RankJob(case=Case(), path="paracheck.zero:Zero1", kind="zero", params=[], state_dict={})
    with pytest.raises(ValueError, match="RankJob grads=None"):
        job.require("params", "state_dict", "grads")
