"""What runs in the driver on what the ranks returned: one module per property, each opening with
what the property means, what it reads from the ``RankRecord``s and what it compares with.

* ``equivalence``: initial state, gradients, parameters, each rank's optimizer state against the
  oracle, and bitwise agreement between ranks (the properties ``initial-state``, ``gradients``,
  ``parameters``, ``optimizer-state``, ``rank-agreement``, ``structure``);
* ``float64_bound``: every synchronised gradient against the float64 oracle, within a bound
  derived from the case's precision (``float64-bound``);
* ``state``: the union over ranks of the optimizer state, and ``state-consolidated``;
* ``memory``, ``balance``, ``traffic``: the sharding kinds' resources against their models;
* ``reduced_once``, ``freed``, ``gather_dtype``: an FSDP's collectives and gathered storages;
* ``reduce_dtype``: the dtype a target declares it reduces gradients in;
* ``bucket_structure``: a bucketed DDP's all-reduce calls against its cap;
* ``world_size_relation``, ``bucket_size_independence``: oracle-free, two runs of the target.

Which property applies to which kind, and which are checked by default, is
``paracheck.check.kinds``.
"""

from paracheck.check.properties._divergence import Divergence, property_of

__all__ = ["Divergence", "property_of"]
