"""bug: core: zero_grad() clears .grad but not the accumulated gradient shard

Each step's gradient is added to the previous steps' averaged gradients.
"""

from corpus.zero1_owner_rs import OwnerZeRO1


class KeepsAccumulatedZeRO1(OwnerZeRO1):
    def _clear(self):
        pass
