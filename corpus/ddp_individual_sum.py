"""bug: core: the gradients are summed over the ranks and never divided by the world size"""

from corpus.ddp_individual_sync import IndividualSyncDDP


class SumNotMeanDDP(IndividualSyncDDP):
    def _average(self, summed):
        return summed
