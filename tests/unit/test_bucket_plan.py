"""The bucket plan (``paracheck.ddp.plan``) obeys its rules, without processes.

Rules: every planned parameter in exactly one bucket; buckets hold parameters in reverse
registration order; a bucket exceeds the cap only when it holds a single parameter; buckets are
greedy (closed only when the next parameter would not fit, or has another key); one key per
bucket; offsets are the running element counts. Each rule is shown to catch a planted planner bug.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from paracheck.ddp.plan import MB, Bucket, BucketPlan, plan_buckets
from paracheck.mutants.ddp import _plan_dropping_oversized
from paracheck.strategies import bucket_sizes_mb

_SETTINGS = settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)


@st.composite
def plan_inputs(draw):
    """(numels, element_sizes, keys, bucket_size_mb): up to 12 parameters, 1 or 2 keys, caps from
    one byte to above the whole model (``paracheck.strategies.bucket_sizes_mb``), shrinking toward
    few small parameters and a 1-byte cap."""
    n = draw(st.integers(0, 12))
    numels = draw(st.lists(st.integers(1, 64), min_size=n, max_size=n))
    sizes = draw(st.lists(st.sampled_from([4, 8, 2]), min_size=n, max_size=n))
    keys = draw(st.lists(st.sampled_from(["a", "b"]), min_size=n, max_size=n))
    nbytes = [a * b for a, b in zip(numels, sizes)]
    # paracheck's own cap strategy: a third of its caps sit exactly on (or a byte off) a boundary.
    mb = draw(bucket_sizes_mb(model_bytes=max(1, sum(nbytes)), param_bytes=nbytes))
    return numels, sizes, keys, mb


def violations(plan: BucketPlan, numels, sizes, keys, bucket_size_mb) -> list[str]:
    """The rules ``plan`` breaks (empty when it is a correct plan of the inputs)."""
    out = []
    cap = bucket_size_mb * MB
    order = [i for b in plan.buckets for i in b.params]
    if sorted(order) != list(range(len(numels))):
        out.append("partition")
    if order != list(reversed(range(len(numels)))):
        out.append("order")
    for k, b in enumerate(plan.buckets):
        nbytes = sum(numels[i] * sizes[i] for i in b.params)
        if not b.params:
            out.append("empty")
        if nbytes != b.nbytes or b.numel != sum(numels[i] for i in b.params):
            out.append("sizes")
        if nbytes > cap and len(b.params) > 1:
            out.append("cap")
        if len({keys[i] for i in b.params}) > 1:
            out.append("key")
        running = 0
        for i, off in zip(b.params, b.offsets):
            if off != running:
                out.append("offsets")
            running += numels[i]
        if k + 1 < len(plan.buckets):
            nxt = plan.buckets[k + 1].params[0]
            fits = nbytes + numels[nxt] * sizes[nxt] <= cap and keys[nxt] == keys[b.params[-1]]
            if fits:
                out.append("greedy")
    return sorted(set(out))


@_SETTINGS
@given(plan_inputs())
def test_plan_obeys_every_rule(inputs):
    """plan_buckets' plan partitions the parameters, in reverse order, greedily, within the cap."""
    numels, sizes, keys, mb = inputs
    plan = plan_buckets(numels, sizes, bucket_size_mb=mb, keys=keys)
    assert violations(plan, numels, sizes, keys, mb) == []


def test_parameter_larger_than_cap_gets_its_own_bucket():
    """A 64-byte parameter under a 16-byte cap sits alone; its small neighbours share a bucket."""
    plan = plan_buckets([2, 8, 1, 1], [8, 8, 8, 8], bucket_size_mb=16 / MB)
    assert [b.params for b in plan.buckets] == [(3, 2), (1,), (0,)]
    assert [b.offsets for b in plan.buckets] == [(0, 1), (0,), (0,)]


@pytest.mark.parametrize("bad", [0, -1, -0.5, math.nan, math.inf, -math.inf])
def test_invalid_bucket_size_refused(bad):
    """bucket_size_mb <= 0, NaN or infinite is refused, naming the argument and the rule."""
    with pytest.raises(ValueError, match=r"bucket_size_mb=.* must be a finite number > 0"):
        plan_buckets([1], [4], bucket_size_mb=bad)


@pytest.mark.parametrize("bad", ["abc", object()])
def test_non_numeric_bucket_size_refused(bad):
    """A bucket_size_mb that is not a number (nor None) is refused as such."""
    with pytest.raises(TypeError, match="bucket_size_mb=.* must be a number of megabytes"):
        plan_buckets([1], [4], bucket_size_mb=bad)


def test_no_cap_plans_one_bucket_per_key():
    """bucket_size_mb=None puts every parameter of a key in one bucket, however large."""
    plan = plan_buckets(
        [2**30, 3, 5, 7], [8, 8, 4, 4], bucket_size_mb=None, keys=["a", "a", "b", "b"]
    )
    assert [b.params for b in plan.buckets] == [(3, 2), (1, 0)]


def test_caps_shrink_toward_several_multi_parameter_buckets():
    """The cap strategy's simplest cap gives several buckets, one of several parameters."""
    nbytes = [96, 32, 64, 16]
    mb = find(bucket_sizes_mb(model_bytes=sum(nbytes), param_bytes=nbytes), lambda _: True)
    plan = plan_buckets([b // 8 for b in nbytes], [8] * 4, bucket_size_mb=mb)
    assert len(plan.buckets) >= 2 and max(len(b.params) for b in plan.buckets) >= 2


# -- the rules catch planted planner bugs ------------------------------------------------------


def _forward_order(numels, sizes, *, bucket_size_mb, keys=None):
    plan = plan_buckets(
        numels[::-1],
        sizes[::-1],
        bucket_size_mb=bucket_size_mb,
        keys=None if keys is None else keys[::-1],
    )
    n = len(numels)
    return BucketPlan(
        tuple(
            Bucket(tuple(n - 1 - i for i in b.params), b.offsets, b.numel, b.nbytes, b.key)
            for b in plan.buckets
        ),
        plan.cap_bytes,
    )


def _closes_at_cap(numels, sizes, *, bucket_size_mb, keys=None):
    # Off by one: closes a bucket when the next parameter would *reach* the cap (>=, not >).
    cap = bucket_size_mb * MB
    buckets, cur = [], []
    for i in reversed(range(len(numels))):
        size = numels[i] * sizes[i]
        if cur and (
            sum(numels[j] * sizes[j] for j in cur) + size >= cap or keys[i] != keys[cur[-1]]
        ):
            buckets.append(cur)
            cur = []
        cur.append(i)
    if cur:
        buckets.append(cur)
    return _as_plan(buckets, numels, sizes, keys, cap)


def _ignores_keys(numels, sizes, *, bucket_size_mb, keys=None):
    return plan_buckets(numels, sizes, bucket_size_mb=bucket_size_mb)


def _as_plan(buckets, numels, sizes, keys, cap):
    out = []
    for b in buckets:
        offs = [sum(numels[j] for j in b[:k]) for k in range(len(b))]
        out.append(
            Bucket(
                tuple(b),
                tuple(offs),
                sum(numels[j] for j in b),
                sum(numels[j] * sizes[j] for j in b),
                keys[b[0]],
            )
        )
    return BucketPlan(tuple(out), cap)


@pytest.mark.parametrize(
    "planner, rule",
    [
        (_plan_dropping_oversized, "partition"),  # the ddp-oversized-param-dropped mutant's planner
        (_forward_order, "order"),
        (_closes_at_cap, "greedy"),
        (_ignores_keys, "key"),
    ],
)
def test_rules_catch_planted_planner_bugs(planner, rule):
    """Each broken planner yields, on some generated input, a plan that breaks its rule."""

    def broken(inputs):
        numels, sizes, keys, mb = inputs
        plan = planner(numels, sizes, bucket_size_mb=mb, keys=keys)
        return rule in violations(plan, numels, sizes, keys, mb)

    find(
        plan_inputs(),
        broken,
        settings=settings(
            max_examples=500,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        ),
    )
