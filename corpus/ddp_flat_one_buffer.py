"""bug: float32-layer: every gradient goes into one flat buffer, whatever its parameter's dtype

torch.cat promotes a float32 layer's gradient to float64 (or the flags to the first dtype), and
the averaged slice written back has the buffer's dtype, not the parameter's.
"""

from corpus.ddp_flat import FlatDDP


class OneBufferDDP(FlatDDP):
    def _groups(self):
        return [self.params] if self.params else []
