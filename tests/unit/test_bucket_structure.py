"""The bucket-structure rules (``paracheck.check.properties.bucket_structure``) accept every reasonable
correct bucketing and reject the cap ignored or read in bytes, without processes.

The payloads are what a design would all-reduce in one window, computed from its plan: greedy in
reverse or in registration order, buckets per dtype across the model, presence flags inside the
buckets or in one call of their own. The inputs are ``test_bucket_plan``'s (paracheck's own cap
strategy over up to 12 parameters of 1 or 2 dtypes).
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, find, given, settings

from paracheck.check.properties.bucket_structure import METADATA_BYTES_PER_PARAM, window_violation
from paracheck.ddp.plan import MB, plan_buckets
from tests.unit.test_bucket_plan import plan_inputs

_SETTINGS = settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)


def _params(numels, sizes, keys):
    return [(n * s, f"{k}{s}") for n, s, k in zip(numels, sizes, keys)]


def _payloads(plan, numels, sizes, *, flags_inside: bool, flag_bytes: int = 8):
    out = [b.nbytes + (len(b.params) * flag_bytes if flags_inside else 0) for b in plan.buckets]
    return out if flags_inside else out + [len(numels) * flag_bytes]


def _designs(numels, sizes, keys, mb):
    """The payloads of correct designs: (name, payloads)."""
    dkeys = [f"{k}{s}" for k, s in zip(keys, sizes)]  # a dtype is a key and an element size
    reverse = plan_buckets(numels, sizes, bucket_size_mb=mb, keys=dkeys)
    forward = plan_buckets(numels[::-1], sizes[::-1], bucket_size_mb=mb, keys=dkeys[::-1])
    order = sorted(range(len(numels)), key=lambda i: dkeys[i])  # parameters grouped by dtype first
    per_dtype = plan_buckets(
        [numels[i] for i in order],
        [sizes[i] for i in order],
        bucket_size_mb=mb,
        keys=[dkeys[i] for i in order],
    )
    for name, plan in (("reverse", reverse), ("forward", forward), ("per-dtype", per_dtype)):
        for inside in (True, False):
            yield (
                f"{name}, flags {'inside' if inside else 'apart'}",
                _payloads(plan, numels, sizes, flags_inside=inside),
            )
    # Closed as soon as a bucket reaches the cap, with the parameter that took it there (torch
    # DDP's reading of bucket_cap_mb), per dtype, in reverse registration order, flags inside.
    cap, closing = mb * MB, []
    for key in dict.fromkeys(dkeys[::-1]):
        size = count = 0
        for i in reversed(range(len(numels))):
            if dkeys[i] != key:
                continue
            size, count = size + numels[i] * sizes[i], count + 1
            if size >= cap:
                closing.append(size + count * 8)
                size = count = 0
        if count:
            closing.append(size + count * 8)
    yield "closed on reaching the cap, flags inside", closing


@_SETTINGS
@given(plan_inputs())
def test_correct_bucketings_obey_the_rules(inputs):
    """Greedy plans in either order, per dtype, with flags inside or apart, and buckets closed on
    reaching the cap, break no rule."""
    numels, sizes, keys, mb = inputs
    if not numels:
        return
    params = _params(numels, sizes, keys)
    for name, payloads in _designs(numels, sizes, keys, mb):
        assert window_violation(payloads, params, mb * MB) is None, name


def test_one_unbounded_bucket_obeys_the_rules():
    """With bucket_size_mb=None one bucket per dtype (flags inside) breaks no rule."""
    params = [(32, "f8"), (8, "f8"), (16, "f4"), (4, "f4")]
    assert window_violation([40 + 16, 20 + 16], params, math.inf) is None


def test_unobserved_collectives_fail_no_rule():
    """Fewer calls or bytes than the gradients (a C++ reducer, a pre-bound all_reduce) is no failure."""
    params = [(64, "f8")] * 6
    assert window_violation([8 * 6], params, 100) is None


def test_rules_reject_cap_ignored_and_cap_in_bytes():
    """One bucket under a small cap, and every parameter alone under a large one, each break a rule."""

    def ignored(inputs):
        numels, sizes, keys, mb = inputs
        params = _params(numels, sizes, keys)
        one = plan_buckets(numels, sizes, bucket_size_mb=None, keys=[p[1] for p in params])
        return (
            bool(numels)
            and window_violation(_payloads(one, numels, sizes, flags_inside=True), params, mb * MB)
            is not None
        )

    def in_bytes(inputs):
        numels, sizes, keys, mb = inputs
        params = _params(numels, sizes, keys)
        alone = plan_buckets(numels, sizes, bucket_size_mb=mb / MB, keys=[p[1] for p in params])
        return (
            bool(numels)
            and window_violation(
                _payloads(alone, numels, sizes, flags_inside=True), params, mb * MB
            )
            is not None
        )

    cfg = settings(
        max_examples=500, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    find(plan_inputs(), ignored, settings=cfg)
    find(plan_inputs(), in_bytes, settings=cfg)


def test_gradient_reduced_twice_breaks_a_rule():
    """A bucket all-reduced twice in one window carries more than the gradients plus their flags."""
    params = [(8, "f8")] * 4
    payloads = [16 + 16, 16 + 16, 16 + 16]
    found = window_violation(payloads, params, 16)
    assert found is not None and "reduced twice" in found[2]
    assert METADATA_BYTES_PER_PARAM == 8
