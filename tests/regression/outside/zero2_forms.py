"""The outside ZeRO-2 with ``full_gradients()`` in the two other forms a reader of the interface
may choose: one entry per module parameter (None for frozen ones), and a dict by name that leaves
out the parameters without a gradient."""

from tests.regression.outside.zero2 import ZeRO2


class EveryParameterZeRO2(ZeRO2):
    def full_gradients(self):
        grads = dict(zip(map(id, self._trainable), super().full_gradients()))
        return [grads.get(id(p)) for p in self.module.parameters()]


class ByNameZeRO2(ZeRO2):
    def full_gradients(self):
        grads = dict(zip(map(id, self._trainable), super().full_gradients()))
        return {
            n: grads[id(p)]
            for n, p in self.module.named_parameters()
            if grads.get(id(p)) is not None
        }
