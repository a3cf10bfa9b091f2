"""A data-parallel wrapper of the user's own, built on paracheck's flat DDP.

The gate measures it as ``paracheck gate --base main mypkg.ddp:MyDDP``: each commit's copy of
this file trains paracheck's LM workload on 2 ranks, and the two commits' step times and exact
memory and traffic are compared.
"""

from paracheck.ddp import FlatDDP


class MyDDP(FlatDDP):
    """Equal to the single-process oracle as FlatDDP is: gradients are all-reduced as one flat
    buffer in ``finish_gradient_synchronization()``, a collective every rank must call."""
