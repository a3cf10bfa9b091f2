"""bug: unused-always: a parameter no rank has a gradient for is stepped with a zero gradient

"Every owned parameter gets a gradient": the optimizer then steps a parameter single-process
training skips (weight decay moves it, momentum and Adam state appear).
"""

import torch

from corpus.zero1_owner_rs import OwnerZeRO1


class ZerosForMissingZeRO1(OwnerZeRO1):
    def _missing(self, p):
        return torch.zeros_like(p)
