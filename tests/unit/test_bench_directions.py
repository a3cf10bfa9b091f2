"""Every asv benchmark of ``benchmarks/`` is lower-is-better and its unit says so: asv 0.6 lists a
rise of any benchmark as a regression (``asv.step_detect.detect_regressions`` looks for upward
steps only), so a higher-is-better metric there would list its improvements as regressions."""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Units whose quantity is lower-is-better by nature; any other unit must say "lower is better".
LOWER_IS_BETTER = {
    "seconds",
    "bytes",
    "collectives",
    "operators",
    "launches",
    "allocations",
    "hook calls",
}


def _benchmarks():
    for tier in ("cpu", "gpu"):
        folder = os.path.join(ROOT, "benchmarks", tier)
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".py") or name.startswith("_"):
                continue
            tree = ast.parse(open(os.path.join(folder, name)).read())
            for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
                units = {}
                for node in cls.body:
                    if (
                        isinstance(node, ast.Assign)
                        and isinstance(node.targets[0], ast.Attribute)
                        and node.targets[0].attr == "unit"
                        and isinstance(node.value, ast.Constant)
                    ):
                        units[node.targets[0].value.id] = node.value.value
                for node in cls.body:
                    if isinstance(node, ast.FunctionDef) and node.name.startswith("track_"):
                        yield f"{tier}.{name[:-3]}.{cls.name}.{node.name}", units.get(node.name)


BENCHMARKS = list(_benchmarks())


def test_the_suite_has_benchmarks():
    """The scan finds the suite's track_ methods (a scan that finds nothing would pass anything)."""
    names = [n for n, _ in BENCHMARKS]
    assert len(names) > 30 and "cpu.allreduce.AllReduce.track_seconds_per_bus_gb" in names


@pytest.mark.parametrize("name,unit", BENCHMARKS, ids=[n for n, _ in BENCHMARKS])
def test_benchmark_is_lower_is_better(name, unit):
    """The unit is a count or a size (LOWER_IS_BETTER) or says "lower is better"."""
    assert unit is not None, f"{name} has no unit"
    assert unit in LOWER_IS_BETTER or "lower is better" in unit, f"{name}: unit {unit!r}"
