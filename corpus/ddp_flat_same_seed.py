"""bug: core: nothing is broadcast at construction ("every rank uses the same seed")

Ranks that construct different initial weights train from different starting points.
"""

from corpus.ddp_flat import FlatDDP


class SameSeedDDP(FlatDDP):
    def _broadcast_initial(self, module):
        pass
