"""ZeRO-1 designs for ``test_unreached_readings``, importable by the rank processes."""

from corpus.zero1_owner_rs import OwnerZeRO1


class OwnerPresenceZeRO1(OwnerZeRO1):
    """``OwnerZeRO1`` minus the agreement on which parameters have a gradient: the owner keeps the
    averaged gradient of a parameter only where its own backward reached it, so a parameter that
    another rank used is skipped (a bug, whichever reading of Note [A parameter no rank reached]
    a design takes)."""

    def finish_gradient_synchronization(self):
        reached = {p for p in self.trainable if p.grad is not None or p in self.acc}
        super().finish_gradient_synchronization()
        for p in [p for p in self.acc if p not in reached]:
            del self.acc[p]
