"""bug: unused-some-ranks: finish waits (sleeping) until every parameter's hook has fired

finish_gradient_synchronization() polls until each trainable parameter's hook has run, which never
happens for a parameter this rank did not use: the rank sleeps forever.
"""

import time

from corpus.ddp_individual_async import IndividualAsyncDDP


class WaitForHooksDDP(IndividualAsyncDDP):
    def finish_gradient_synchronization(self):
        while not all(self.ready):
            time.sleep(0.01)
        super().finish_gradient_synchronization()
