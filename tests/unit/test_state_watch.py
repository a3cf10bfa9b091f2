"""``StateWatch``: which parameters' optimizer state a rank steps (Note [State stepped on two
ranks] in ``paracheck.check.properties.memory``)."""

import torch

from paracheck.check.ranks._optimizer import StateWatch


class Wrapper:
    """A sharded optimizer of the shape users write: its own class, the real optimizer under a
    name paracheck does not know, a second one in a list."""

    def __init__(self, params):
        self.inner_by_any_name = torch.optim.Adam(params[:1], lr=0.1)
        self.more = [torch.optim.SGD(params[1:], lr=0.1, momentum=0.9)]

    def step(self):
        self.inner_by_any_name.step()
        self.more[0].step()


def _params():
    params = [torch.nn.Parameter(torch.ones(2, 3)), torch.nn.Parameter(torch.ones(4))]
    for p in params:
        p.grad = torch.full_like(p, 0.5)
    return params


def test_stepped_means_held_before_and_changed_since():
    params = _params()
    opt = Wrapper(params)
    watch = StateWatch({id(p): i for i, p in enumerate(params)})
    opt.step()
    assert watch.stepped(opt) == ()  # state created in this step: nothing to compare with yet
    opt.step()
    assert watch.stepped(opt) == (0, 1)  # Adam's moments and SGD's momentum, found by walking
    assert watch.stepped(opt) == ()  # no step in between: nothing changed


def test_a_stale_copy_is_not_stepped_even_holding_nan():
    params = _params()
    watch = StateWatch({id(p): i for i, p in enumerate(params)})
    holder = torch.optim.SGD(params, lr=0.1)
    holder.state[params[0]] = {"exp_avg": torch.full((2, 3), float("nan"))}
    holder.state[params[1]] = {"exp_avg": torch.zeros(4)}
    watch.stepped(holder)
    assert watch.stepped(holder) == ()  # NaN is compared by its bits
    holder.state[params[1]]["exp_avg"].add_(1)
    assert watch.stepped(holder) == (1,)


def test_state_of_other_shapes_or_other_keys_is_not_seen():
    """A flat shard, a float32 master's state, a scalar ``step``: not the parameter's own."""
    params = _params()
    watch = StateWatch({id(p): i for i, p in enumerate(params)})
    master = torch.zeros(6, requires_grad=True)
    holder = torch.optim.SGD(params, lr=0.1)
    holder.state[params[0]] = {"shard": torch.zeros(3), "step": torch.tensor(0.0)}
    holder.state[master] = {"exp_avg": torch.zeros(6)}
    watch.stepped(holder)
    for entry in holder.state.values():
        for v in entry.values():
            v.add_(1)
    assert watch.stepped(holder) == ()
