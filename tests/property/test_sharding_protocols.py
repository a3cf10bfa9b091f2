"""The sharding check accepts every reading of the CS336 ShardedOptimizer interface a correct
implementation may take (a per-rank ``state_dict()``, a target that is not a torch optimizer) and
models real training where the harness used to step in (gradients of a parameter outside every
group accumulate until its group is added)."""

from dataclasses import replace

import torch
import torch.distributed as dist

from paracheck.cases import (
    Case,
    GroupSpec,
    OptimizerSpec,
    add_late_groups,
    build_case_model,
    build_optimizer,
)
from paracheck.check.properties.state import compare_state_union, state_convention
from paracheck.check.property import check_target
from paracheck.check.run import run_case
from paracheck.check.targets import Target, resolve_target
from paracheck.oracle import train
from paracheck.workloads import MLPSpec


class ShardsStateDictOptimizer(torch.optim.Optimizer):
    """A correct CS336 ShardedOptimizer written independently of ``paracheck.zero``, whose
    ``state_dict()`` is torch's own over ``self.state``: this rank's shard, under global indices.

    Each parameter goes to the least loaded rank (by trainable bytes, in order); the wrapped
    optimizer has one group per group of ``param_groups`` (possibly empty) and shares ``self.state``;
    ``step()`` copies the hyper-parameters in, steps, and broadcasts every trainable parameter from
    its owner. ``load_state_dict()`` accepts what this rank's ``state_dict()`` returned, at the same
    world size (a shard cannot be loaded elsewhere). Collective: ``step()``.
    """

    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        self.owner, self.loads, self.local = {}, [0] * self.world_size, None
        super().__init__(params, kwargs)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        mine = []
        for p in group["params"]:
            r = self.loads.index(min(self.loads))
            self.owner[p] = r
            self.loads[r] += p.numel() * p.element_size() if p.requires_grad else 0
            if r == self.rank:
                mine.append(p)
        local = {k: v for k, v in group.items() if k != "params"}
        if self.local is None:
            self.local = self.optimizer_cls([{**local, "params": mine}], **self.kwargs)
            self.local.state = self.state
        else:
            self.local.add_param_group({**local, "params": mine})

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)  # replaces self.state and the group dicts
        self.local.state = self.state

    def step(self, closure=None):
        for group, local in zip(self.param_groups, self.local.param_groups):
            local.update({k: v for k, v in group.items() if k != "params"})
        loss = self.local.step(closure)
        if self.world_size > 1:
            for group in self.param_groups:
                for p in group["params"]:
                    if p.requires_grad:
                        dist.broadcast(p.detach(), src=self.owner[p])
        return loss


class NotATorchOptimizer:
    """``paracheck.zero.ShardedOptimizer`` behind a plain class: the interface's methods, and
    ``param_groups``, but not a ``torch.optim.Optimizer`` (no LR scheduler can be built on it)."""

    def __init__(self, params, optimizer_cls, **kwargs):
        from paracheck.zero import ShardedOptimizer

        self.inner = ShardedOptimizer(params, optimizer_cls, **kwargs)
        self.param_groups = self.inner.param_groups

    def step(self, closure=None):
        return self.inner.step(closure)

    def zero_grad(self, set_to_none=True):
        self.inner.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, group):
        self.inner.add_param_group(group)

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state_dict):
        self.inner.load_state_dict(state_dict)


CONTROL = Target("shards-state-dict", f"{__name__}:ShardsStateDictOptimizer", "sharded")
ADAM_TWO_GROUPS = Case(
    model=MLPSpec(in_features=3, widths=(4, 2), bias=True),
    world_size=2,
    batch_sizes=(2, 1),
    steps=3,
    optimizer=OptimizerSpec(
        "adam", (GroupSpec(params=(0, 1)), GroupSpec(params=(2, 3), lr=0.02, add_at_step=2))
    ),
)


def test_per_rank_shards_state_dict_matches_oracle(world, paracheck_world_sizes):
    """A correct optimizer whose state_dict() is this rank's shard passes every default property on
    generated cases (the union of the shards equals the oracle's state)."""
    report = check_target(
        CONTROL, world, world_sizes=paracheck_world_sizes, max_examples=40, seed=0
    )
    assert report.passed, report.failure.describe()


def test_report_names_the_state_dict_convention(world):
    """The result says which convention the ranks' state_dict() followed."""
    assert run_case(world, CONTROL, ADAM_TWO_GROUPS).extra["state_dict"] == "per-rank shards"
    assert (
        run_case(world, resolve_target("sharded"), ADAM_TWO_GROUPS).extra["state_dict"]
        == "consolidated"
    )


def test_state_consolidated_refuses_per_rank_shards(world):
    """The opt-in state-consolidated property fails a per-rank state_dict(), naming the missing parameters."""
    result = run_case(
        world, replace(CONTROL, properties=frozenset({"state-consolidated"})), ADAM_TWO_GROUPS
    )
    assert result.divergence is not None and result.divergence.what == "state-consolidated", (
        result.describe()
    )
    assert "has no state for parameters" in result.divergence.detail
    assert run_case(world, resolve_target("sharded", None), ADAM_TWO_GROUPS).ok
    assert run_case(
        world,
        replace(resolve_target("sharded"), properties=frozenset({"state-consolidated"})),
        ADAM_TWO_GROUPS,
    ).ok


def test_union_of_shards_must_cover_and_agree():
    """compare_state_union: shards covering the oracle pass; a parameter on no rank, or two ranks
    returning different state for one parameter, fail; the convention is read from the key sets."""
    ref = {0: {"m": torch.ones(2)}, 1: {"m": torch.zeros(3)}}
    names = ["a", "b"]
    assert compare_state_union(0, [{0: ref[0]}, {1: ref[1]}], ref, 1e-10, names) is None
    assert compare_state_union(0, [ref, ref], ref, 1e-10, names) is None
    assert compare_state_union(0, [{0: ref[0]}, {0: ref[0], 1: ref[1]}], ref, 1e-10, names) is None
    missing = compare_state_union(0, [{0: ref[0]}, {0: ref[0]}], ref, 1e-10, names)
    assert missing is not None and "[1] is on no rank" in missing.detail
    differ = compare_state_union(
        0, [ref, {0: {"m": torch.ones(2) * 2}, 1: ref[1]}], ref, 1e-10, names
    )
    assert (
        differ is not None
        and differ.rank == 1
        and "ranks 0 and 1 return different" in differ.detail
    )
    wrong = compare_state_union(0, [{0: {"m": torch.ones(2) * 2}}, {1: ref[1]}], ref, 1e-10, names)
    assert wrong is not None and wrong.index == 0
    assert state_convention([{0: ref[0]}, {1: ref[1]}], ref) == "per-rank shards"
    assert state_convention([ref, ref], ref) == "consolidated"


def test_scheduler_on_a_non_optimizer_is_skipped_not_failed(world):
    """A target that is not a torch.optim.Optimizer cannot carry an LR scheduler: such a case is
    skipped with a note; without a scheduler the same target is checked and passes."""
    target = Target(
        "not-an-optimizer",
        f"{__name__}:NotATorchOptimizer",
        "sharded",
        properties=frozenset({"equivalence", "state"}),
    )
    case = replace(ADAM_TWO_GROUPS, optimizer=replace(ADAM_TWO_GROUPS.optimizer, scheduler="step"))
    result = run_case(world, target, case)
    assert result.ok and "is not an Optimizer" in result.extra["skipped"], result.describe()
    plain = run_case(world, target, ADAM_TWO_GROUPS)
    assert plain.ok and "skipped" not in plain.extra, plain.describe()


def test_gradient_outside_every_group_accumulates_like_single_process_training():
    """The oracle at one rank equals a plain torch loop (zero_grad, backward, step, scheduler): the
    parameters of a group added before step 2 keep their gradients of steps 0 and 1 until then."""
    from paracheck.cases import batch_for, build_scheduler, loss_fn

    for set_to_none in (True, False):
        case = replace(
            ADAM_TWO_GROUPS.with_world_size(1),
            set_to_none=set_to_none,
            optimizer=replace(ADAM_TWO_GROUPS.optimizer, scheduler="step"),
        )
        traj = train(case)
        model = build_case_model(case, 0)
        params = list(model.parameters())
        opt = build_optimizer(case, params)
        scheduler = build_scheduler(case, opt)
        held = None
        for step, rec in enumerate(traj.steps):
            add_late_groups(case, opt, params, step)
            opt.zero_grad(set_to_none=set_to_none)
            if step == 1:
                held = params[2].grad.clone()  # outside every group: zero_grad() left it
            x, y = batch_for(case, step, 0, 0)
            loss_fn(case, model(x), y).backward()
            for i, p in enumerate(params):
                torch.testing.assert_close(p.grad, rec.grads[i], rtol=1e-12, atol=0)
            opt.step()
            scheduler.step()
            for i, p in enumerate(params):
                torch.testing.assert_close(p.detach(), rec.params[i], rtol=1e-12, atol=0)
        assert held is not None and held.abs().sum() > 0
        torch.testing.assert_close(held, traj.steps[0].grads[2], rtol=0, atol=0)


def test_reload_into_a_fresh_instance_works_with_both_conventions(world):
    """state_dict() -> a fresh instance (constructor groups, scheduler, the late group added so far)
    -> load_state_dict() before step 2 continues like the oracle, whether state_dict() returns this
    rank's shard or everything; a load_state_dict that skips the wrapped optimizer does not."""
    late = GroupSpec(params=(2, 3), lr=0.02, add_at_step=1)
    case = replace(
        ADAM_TWO_GROUPS,
        steps=4,
        reload_at_step=2,
        optimizer=replace(
            ADAM_TWO_GROUPS.optimizer, groups=(GroupSpec(params=(0, 1)), late), scheduler="step"
        ),
    )
    for target in (CONTROL, resolve_target("sharded"), resolve_target("torch-zero")):
        result = run_case(world, target, case)
        assert result.ok, f"{target.name}: {result.describe()}"
    broken = Target("skips", "paracheck.mutants.sharding:LoadStateDictSkipsWrapped", "sharded")
    result = run_case(world, broken, case)
    assert result.divergence is not None and result.divergence.step == 2, result.describe()


def test_a_schedule_step_after_a_skipped_step_warns_nothing():
    """A GradScaler-skipped step never calls ``optimizer.step()``; the case's schedule still
    steps, and torch's "lr_scheduler.step() before optimizer.step()" warning is not shown."""
    import warnings

    from paracheck.cases import step_scheduler

    p = torch.nn.Parameter(torch.ones(1))
    scheduler = torch.optim.lr_scheduler.StepLR(torch.optim.SGD([p], lr=1.0), step_size=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step_scheduler(scheduler)
    assert [str(w.message) for w in caught] == []


def test_per_rank_shards_read_not_supported_in_the_reshard_row(world):
    """A class whose state_dict() is its own shard cannot be resumed at another world size: its
    reshard row reads "not supported", with why, never FAIL or a bare PASS; the sharded built-in's
    consolidated dict is judged there."""
    from paracheck.check.features import optional_features
    from paracheck.check.settings import CheckSettings

    only_reshard = ",".join(f"-{f}" for f in optional_features() if f != "reshard")
    settings = CheckSettings(
        world_sizes=(2, 3),
        max_examples=8,
        table=True,
        labels=True,
        first_failure=False,
        database=None,
        budget=None,
        timeout=None,
        seed=0,
        features=only_reshard,
    )
    rows = {r.name: r for r in check_target(CONTROL, world, settings).rows}
    assert rows["+reshard"].status == "not supported", rows["+reshard"]
    assert "its own shard" in rows["+reshard"].why
    built_in = {r.name: r for r in check_target(resolve_target("sharded"), world, settings).rows}
    assert built_in["+reshard"].status == "PASS", built_in["+reshard"]
