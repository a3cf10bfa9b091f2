"""Speed and memory: the measuring code shared by the asv suite (``benchmarks/``), the CLI
(``paracheck bench | memory | gate | report``) and ``scripts/gpu_bench.py``.

* ``step``: step time, CUDA/RSS peaks and exact traffic/memory of a variant on W ranks;
* ``comm``: all-reduce time and bus bandwidth; ``overlap``: communication hidden under compute;
* ``lm``: forward / backward / step of one process, with and without bf16 autocast;
* ``_record``: the dispatch-mode recorder behind the exact quantities;
* ``gate``: the merge gate; ``report``: history pages and plots.

Importing this package imports neither torch nor asv: the entry points load what they need.
"""

__all__ = ["bench_main", "gate_main", "memory_main", "report_main"]


def bench_main(argv=None) -> int:
    """``paracheck bench``; see ``paracheck.bench.cli``."""
    from paracheck.bench.cli import bench_main as main

    return main(argv)


def memory_main(argv=None) -> int:
    """``paracheck memory``; see ``paracheck.bench.cli``."""
    from paracheck.bench.cli import memory_main as main

    return main(argv)


def gate_main(argv=None) -> int:
    """``paracheck gate``; see Note [The gate rule] in ``paracheck.bench.gate``."""
    from paracheck.bench.gate import main

    return main(argv)


def report_main(argv=None) -> int:
    """``paracheck report``; see ``paracheck.bench.report``."""
    from paracheck.bench.report import main

    return main(argv)
