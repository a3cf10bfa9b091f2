"""A sharded optimizer with a bug the CS336 handout's cases show (weight decay applied twice) and
one only a property it does not promise shows (an empty ``state_dict()`` on every rank)."""

from paracheck.mutants.sharding import DecayAppliedTwice


class DecayTwiceEmptyState(DecayAppliedTwice):
    def state_dict(self):
        return {}
