"""Note [Device syncs counted on the CPU] and the gradient-byte points of Note [Communication
schedule of a step], in one process on the CPU (no collectives): what counts as a sync, and where
in backward an event lands."""

import torch

from paracheck.accounting.record import Recorder
from paracheck.accounting.schedule import ScheduleWatch


def _watched(model, *extra):
    rec = Recorder(track_memory=False)
    watch = ScheduleWatch(rec, list(model.parameters()), [*model.parameters(), *extra], tokens=1)
    return rec, watch


def _syncs(watch):
    return [(e.kind, e.where.split(".")[-1]) for e in watch.events if e.what == "sync"]


def test_reads_of_device_tensors_are_syncs_and_of_host_tensors_are_not():
    """.item(), .tolist(), .cpu() of a tensor derived from a parameter count; the same of a host
    tensor (torch.tensor(..., device="cpu"), AdamW's step counter) do not."""
    model = torch.nn.Linear(2, 2)

    def reads():
        y = model.weight.sum()
        y.item()
        (y * 2).tolist()
        model.weight.detach().cpu()
        host = torch.tensor(0.0, device="cpu")
        host += 1
        host.item()
        host.tolist()

    rec, watch = _watched(model)
    with rec, watch:
        watch.start()
        reads()
        watch.stop()
    assert _syncs(watch) == [("item", "reads"), ("tolist", "reads"), ("cpu", "reads")]


def test_host_data_copied_to_the_device_is_a_sync():
    """torch.tensor(list, device=p.device) is a host-to-device copy; device="cpu" (a string) is
    not; a tensor made so is a device tensor, and reading it back is a second sync."""
    model = torch.nn.Linear(2, 2)

    def flags():
        f = torch.tensor([1.0, 0.0], device=model.weight.device)
        torch.tensor([1.0], device="cpu").item()
        f.tolist()

    rec, watch = _watched(model)
    with rec, watch:
        watch.start()
        flags()
        watch.stop()
    assert _syncs(watch) == [("to_device", "flags"), ("tolist", "flags")]


def test_copy_between_host_and_device_is_a_sync_unless_non_blocking():
    model = torch.nn.Linear(2, 2)

    def copies():
        host = torch.tensor([0.0, 0.0])
        host.copy_(model.bias.detach())
        host.copy_(model.bias.detach(), non_blocking=True)

    rec, watch = _watched(model)
    with rec, watch:
        watch.start()
        copies()
        watch.stop()
    assert _syncs(watch) == [("to_host", "copies")]


def test_events_in_backward_carry_the_gradient_bytes_produced_before_them():
    """A hook that reads the gradient of the first parameter to be produced sees that gradient's
    bytes counted already (the counter runs before every post-accumulate hook); the patches come
    off on exit."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    last = model[1].bias  # its gradient is among the first produced

    def read_back(p):
        p.grad.sum().item()

    last.register_post_accumulate_grad_hook(read_back)
    original_tolist = torch.Tensor.tolist
    rec, watch = _watched(model)
    with rec, watch:
        watch.start()
        watch.mark("backward")
        model(torch.ones(1, 3)).sum().backward()
        watch.stop()
    s = watch.schedule()
    [sync] = [e for e in s.events if e.what == "sync"]
    assert sync.phase == "backward" and 4 * 2 <= sync.grad_bytes < s.grad_bytes
    assert s.grad_bytes == 4 * sum(p.numel() for p in model.parameters())
    assert torch.Tensor.tolist is original_tolist and rec.observer is None


def test_a_number_set_into_a_device_tensor_is_not_a_sync_but_a_host_tensor_is():
    """``t[i] = 0`` of a device tensor is no host-to-device copy (on a GPU torch makes the number
    a device scalar); copying a host tensor into it still is one."""
    model = torch.nn.Linear(2, 2)

    def flags():
        f = torch.ones(3, device=model.weight.device)
        f[1] = 0
        f[2] = True
        f[0:1] = torch.tensor([0.0], device="cpu")

    rec, watch = _watched(model)
    with rec, watch:
        watch.start()
        flags()
        watch.stop()
    assert _syncs(watch) == [("to_device", "flags")]


def test_what_a_backend_copies_inside_a_work_wait_is_not_a_sync():
    """A copy from a host tensor into a device tensor made inside ``Work.wait`` (gloo's
    reduce-scatter fills its output there) is the collective's; the wait is counted as a wait."""
    from paracheck.accounting._schedule_watch import _work_class

    work = _work_class()
    model = torch.nn.Linear(2, 2)
    host = torch.zeros(2, 2)
    saved = work.wait
    try:
        work.wait = lambda self, *a, **k: model.weight.data.copy_(host) is not None
        rec, watch = _watched(model)
        with rec, watch:
            watch.start()
            work.wait(None)
            model.weight.data.copy_(host)  # outside a wait: a sync
            watch.stop()
    finally:
        work.wait = saved
    assert [e.kind for e in watch.events if e.what == "wait"] == ["work.wait"]
    assert _syncs(watch) == [
        ("to_device", "test_what_a_backend_copies_inside_a_work_wait_is_not_a_sync")
    ]
