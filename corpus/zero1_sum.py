"""bug: core: the reduce-scattered gradients are never divided by the world size"""

from corpus.zero1_owner_rs import OwnerZeRO1


class SumZeRO1(OwnerZeRO1):
    def _average(self, summed):
        return summed
