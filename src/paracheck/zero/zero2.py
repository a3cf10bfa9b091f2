"""Zero2: ZeRO stage 2. ``Zero1`` whose gradients are whole only while their bucket is reduced.

Diff with ``Zero1``: there every bucket's full gradient buffer lives as long as the wrapper (P'
elements per rank, P' the padded parameter count), and rank r's averaged chunk is a view into it
(Note [Zero1 in-place reduce-scatter]). Here a bucket's full buffer is allocated by the round's
first write into it and freed once its reduce-scatter has completed, which backward waits for when
it launches the next bucket; what stays is a shard buffer of P'/W elements per bucket, the
gradients' whole cost between steps. Traffic is the same (one reduce-scatter per bucket and
backward, one all-gather per bucket and step).

Note [Zero2 gradient lifetime]
    Bucket b's full buffer is created zeroed by the round's first write into it (a hook, or
    ``finish_gradient_synchronization()`` taking a gradient accumulated under ``no_sync()``,
    or the launch of a bucket no parameter of which this rank used) and dropped once its
    reduce-scatter has been waited for. Launching bucket b waits for every reduce-scatter
    launched before it (``IN_FLIGHT = 1``: bucket b - 1's ran while bucket b's gradients were
    produced), so inside backward a rank holds whole at most the bucket launched last, the
    bucket being filled and the parameter gradient autograd has just produced (with buckets
    filled in launch order, the reverse registration order backward usually follows; a bucket
    whose parameters come out of order is held whole from its first write to its launch). On
    NCCL the wait makes the compute stream wait, not the host. Where the reduce-scatters are
    launched by the launcher thread (Note [Launching off the autograd thread]), a bucket whose
    launch the thread has not made yet is not waited for: up to ``QUEUED`` more buckets stay whole
    until it has (the hook would otherwise wait for the thread, launch by launch), so the bound
    above grows by at most ``QUEUED`` buckets there. The reduce-scatter still runs in place, into rank r's
    chunk of that buffer; the chunk, divided by W, is then copied into the shard, or added to it
    where the shard already holds this step's earlier synchronisations (accumulation without
    ``no_sync()``): ``new / W + kept``, the same operations as ``Zero1``'s, so the two agree bit
    for bit. Between a backward and its ``finish_gradient_synchronization()`` the shard (and a
    piece's ``.grad`` kept by ``zero_grad(set_to_none=False)``) holds what the synchronisations
    done so far left, not this rank's local gradient as in ``Zero1``. Within ``no_sync()`` the
    full gradients accumulate in ``p.grad``, as in DDP: ZeRO-2's saving holds between steps and
    across synchronised backward passes, not inside an accumulation window run without them.
"""

from __future__ import annotations

import torch

from paracheck.zero.zero1 import Zero1

__all__ = ["Zero2"]


class Zero2(Zero1):
    """ZeRO-2 data parallelism: ``Zero1``'s interface, contract and collectives, with gradients
    kept only as this rank's shard (Note [Zero2 gradient lifetime]).

    Interface (``paracheck check``'s kind ``zero2``)::

        zero = Zero2(module, torch.optim.AdamW, params=groups_or_params, bucket_size_mb=25, lr=1e-3)
        loss = loss_fn(zero(x), y); loss.backward(); zero.finish_gradient_synchronization()
        zero.step(); zero.zero_grad(set_to_none=True)

    ``gradient_bytes()`` is the gradient storage this rank holds now: the shards only, once every
    synchronisation has finished.
    """

    #: Reduce-scatters left running once a bucket is launched (Note [Zero2 gradient lifetime]):
    #: the older ones are waited for and their full buffers freed.
    IN_FLIGHT = 1
    #: More buckets allowed whole while the launcher thread has not made their launch yet.
    QUEUED = 3

    def _gradient_buffers(self, padded: int, kw: dict):
        s = padded // self.world_size
        return None, torch.zeros(s, **kw)

    def _flat(self, b: int) -> torch.Tensor:
        if self._grad_flat[b] is None:
            ref = self._grad_shard[b]
            self._grad_flat[b] = torch.zeros(
                self.layout.buckets[b].padded, dtype=ref.dtype, device=ref.device
            )
        return self._grad_flat[b]

    def _reduced_chunk(self, b: int) -> torch.Tensor:
        s = self.layout.shard_numel(b)
        return self._flat(b).narrow(0, self.rank * s, s)

    def _kept(self, b: int) -> torch.Tensor:
        # The shard is a buffer of its own: the round cannot overwrite it, no copy is needed.
        return self._grad_shard[b]

    def _release(self, b: int) -> None:
        self._grad_flat[b] = None

    def _launch(self, b: int) -> None:
        super()._launch(b)
        limit = self.IN_FLIGHT + (self.QUEUED if self._off_thread else 0)
        while len(self._inflight) > self.IN_FLIGHT:
            handle = self._inflight[0][1]
            if len(self._inflight) <= limit and not getattr(handle, "launched", True):
                break  # its launch is still queued: settled by a later launch or the finish
            self._settle(*self._inflight.pop(0))
