"""Targets for the report tests: two independent bugs in one DDP, a DDP that raises on one rank,
and a DDP that prints a lot (from Python and below it) before failing."""

import os

import torch.distributed as dist

from paracheck.mutants.ddp import BuffersNotBroadcastDDP, NoDivideDDP


class TwoBugsDDP(NoDivideDDP):
    """NoDivideDDP that also forgets to broadcast buffers: two bugs, two failing properties."""

    _state_tensors = BuffersNotBroadcastDDP._state_tensors


class RaisesOnRank1DDP(NoDivideDDP):
    """Raises in its own code on rank 1 whenever it synchronises with more than one rank."""

    def finish_gradient_synchronization(self) -> None:
        if self.world_size > 1 and dist.get_rank() == 1:
            raise ValueError("planted failure in the target on rank 1")
        super().finish_gradient_synchronization()


class ChattyDDP(NoDivideDDP):
    """NoDivideDDP that prints 300 lines per synchronisation, half through the file descriptor."""

    def finish_gradient_synchronization(self) -> None:
        for i in range(150):
            print(f"chatty python line {i}")
            os.write(1, f"chatty fd line {i}\n".encode())
        super().finish_gradient_synchronization()
