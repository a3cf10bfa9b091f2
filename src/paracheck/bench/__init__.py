"""Speed and memory measuring, shared by the asv suite (``benchmarks/``), the CLI
(``paracheck bench | memory``, ``paracheck.cli.bench``), the merge gate's workers
(``paracheck.gate``) and ``scripts/gpu_bench.py``.

* ``step``: step time, CUDA/RSS peaks and exact traffic/memory of a variant on W ranks;
* ``comm``: all-reduce time and bus bandwidth; ``overlap``: communication hidden under compute;
* ``lm``: forward / backward / step of one process, with and without bf16 autocast;
* ``rmsnorm``: the RMSNorm kernels' timers; ``variants``: the measured designs by name;
* ``suites``: the models and grids of the tiers; ``asvtools``: what the asv classes call;
* ``machine``: where a measurement was taken.

Importing this package imports neither torch nor asv.
"""
