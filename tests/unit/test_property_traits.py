"""The traits the driver reads of a property are the catalog row's, and agree with the code that
judges it: a check that runs the target again is marked so (and checked after the others), a row
judged on a declared partition is the one whose module reads it, and each ``Divergence.what``
is reported as the property its row names."""

from __future__ import annotations

import importlib
import inspect

from paracheck.check.properties import Divergence
from paracheck.check.properties.catalog import PARTITIONED, PROPERTIES, RERUNS, reported_property

# The functions (``paracheck.check.properties._sharding``) a check reads a declared partition with.
PARTITION_READERS = ("declares_partition", "owners_disagree")


def _judging_function(row):
    module, _, name = row.check.reference.partition(":")
    return getattr(importlib.import_module(module), name)


def test_a_check_that_runs_the_target_again_is_marked_so():
    """A check takes the World first exactly where its row says it runs the target again."""
    for row in PROPERTIES.values():
        if row.check is None:
            assert not row.reruns, row.name
            continue
        first = next(iter(inspect.signature(_judging_function(row)).parameters))
        assert row.reruns == (first == "world"), (row.name, first)
    assert {"repeatability", "world-size-relation", "reshard"} <= RERUNS
    assert not RERUNS & {"equivalence", "float64-bound", "memory"}


def test_a_row_needs_a_partition_where_its_module_reads_one():
    for row in PROPERTIES.values():
        if row.check is None:
            assert not row.needs_partition, row.name
            continue
        source = inspect.getsource(inspect.getmodule(_judging_function(row)))
        reads = any(f"{name}(" in source for name in PARTITION_READERS)
        assert row.needs_partition == reads, row.name
    assert PARTITIONED == {"balance", "memory", "traffic"}


def test_each_divergence_is_reported_as_its_rows_property():
    """Pinned: the equivalence family's tensors by name, the initial state at step -1."""
    expected = {
        ("grad", 0): "gradients",
        ("param", 0): "parameters",
        ("state", 2): "optimizer-state",
        ("master", 1): "master-weights",
        ("buffer", 0): "initial-state",
        ("param", -1): "initial-state",
        ("buffer", -1): "initial-state",
        ("memory", 0): "memory",
        ("rank-agreement", 3): "rank-agreement",
    }
    for (what, step), name in expected.items():
        assert reported_property(what, step) == name, (what, step)
        assert Divergence(step, what, 0, None, None, 0.0, 0.0).property == name
    for row in PROPERTIES.values():
        for what in row.reported_as:
            assert reported_property(what, 0) == row.name
