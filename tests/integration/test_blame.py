"""Whose failure a rank's exception is, and what of its traceback a report shows: torch raising on
the target's own objects is the target's, named with its object (Note [Raised on the target's
objects]); paracheck's frames are left out of a rank's traceback, counted (Note [A rank's
traceback])."""

import pytest
import torch

from paracheck.cases import Case, GroupSpec, OptimizerSpec
from paracheck.check.failure import PropertyFailure
from paracheck.check.run import run_case
from paracheck.check.targets import Target
from paracheck.workloads.mlp import MLPSpec
from paracheck.world import World
from paracheck.world._blame import blame
from paracheck.world._failures import RankError, RankFailure, hide_harness_frames

PARAMS_ONLY = Target(
    "params-only-groups",
    "tests.integration._blame_targets:ParamsOnlyGroupsShardedOptimizer",
    "sharded",
)

# -- which frames a report shows --------------------------------------------------------------

_HARNESS = (
    "Traceback (most recent call last):\n"
    '  File "/x/paracheck/world/_rank.py", line 420, in _serve\n'
    "    result = fn(payload)\n"
    "             ^^^^^^^^^^^\n"
    '  File "/x/paracheck/check/ranks/ddp.py", line 80, in run_ddp\n'
    "    train_micro_steps(case, ddp, opt, rank, device, step)\n"
    '  File "/x/paracheck/check/ranks/_drive.py", line 40, in forward\n'
    "    return self.model(x)\n"
)
_TORCH_CALL = (
    '  File "/v/site-packages/torch/nn/modules/module.py", line 1775, in _wrapped_call_impl\n'
    "    return self._call_impl(*args, **kwargs)\n"
)
_USER = (
    '  File "/home/me/ddp.py", line 9, in forward\n'
    "    return self.module(x[3])\n"
    "IndexError: index 3 is out of bounds\n"
)


def test_a_traceback_starts_at_the_users_code_with_a_count_of_what_was_hidden():
    """paracheck's frames, and torch's call of the user's module after them, are left out and
    counted; the user's frames and the exception stay."""
    shown = hide_harness_frames(_HARNESS + _TORCH_CALL + _USER)
    assert shown.splitlines()[:2] == [
        "Traceback (most recent call last):",
        "  ... 3 paracheck frames and 1 library frame calling your code hidden "
        "(PARACHECK_FULL_TRACEBACK=1 shows them)",
    ]
    assert shown.endswith(_USER) and "paracheck/" not in shown.replace("PARACHECK_FULL", "")


_COLLECTIVE_CALL = (
    '  File "/home/me/ddp.py", line 28, in finish_gradient_synchronization\n'
    "    dist.all_reduce(p.grad)\n"
    '  File "/x/paracheck/world/_collectives.py", line 291, in counted\n'
    "    return fn(*args, **kwargs)\n"
    "           ^^^^^^^^^^^^^^^^^^^\n"
    '  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 3252, in all_reduce\n'
    "    work.wait()\n"
    '  File "/x/paracheck/world/_collectives.py", line 227, in wait\n'
    "    return original_wait(self, *args, **kwargs)\n"
    "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    "RuntimeError: Connection reset by peer\n"
)


def test_paracheck_s_collective_counters_below_the_users_call_are_hidden_and_counted():
    """A rank raising in the all-reduce its code called: paracheck's two wrappers around torch's
    collective are left out and counted; the user's call and torch's frame stay."""
    shown = hide_harness_frames(_HARNESS + _COLLECTIVE_CALL)
    lines = shown.splitlines()
    assert lines[2] == '  File "/home/me/ddp.py", line 28, in finish_gradient_synchronization'
    assert lines[4] == (
        "  ... 2 paracheck frames counting collectives hidden (PARACHECK_FULL_TRACEBACK=1 shows "
        "them)"
    )
    assert "distributed_c10d.py" in shown and shown.endswith(
        "RuntimeError: Connection reset by peer\n"
    )
    assert "_collectives.py" not in shown
    # An error raised in the wrapper's own code (not its call of torch's) keeps that frame.
    own = _HARNESS + _COLLECTIVE_CALL.replace(
        "return original_wait(self, *args, **kwargs)", "counter.enter_wait()"
    )
    kept = hide_harness_frames(own)
    assert "1 paracheck frame counting collectives hidden" in kept and "in wait" in kept


_HUNG = (
    "Thread 0x00007fa98c2546c0 (most recent call first):\n"
    '  File "/x/paracheck/world/_rank.py", line 175 in run\n'
    '  File "/usr/lib/python3.11/threading.py", line 1045 in _bootstrap_inner\n'
    '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap\n'
    "\n"
    "Current thread 0x00007fa9ba5d8b80 (most recent call first):\n"
    '  File "/x/paracheck/world/_collectives.py", line 227 in wait\n'
    '  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce\n'
    '  File "/x/paracheck/world/_collectives.py", line 291 in counted\n'
    '  File "/home/me/ddp.py", line 28 in finish_gradient_synchronization\n'
    '  File "/x/paracheck/check/ranks/_drive.py", line 40 in run_steps\n'
    '  File "/x/paracheck/world/_rank.py", line 428 in _serve\n'
    '  File "/x/paracheck/world/_entry.py", line 25 in <module>\n'
    '  File "<frozen runpy>", line 88 in _run_code\n'
)


def test_a_hung_ranks_stack_shows_the_users_frames_and_counts_paracheck_s():
    """A rank hung in the all-reduce its code called: paracheck's reader thread, its wrappers
    around the collective and the rank program below the user's frame are left out, counted;
    a thread with no frame of the user's (paracheck hung in its own code) is kept whole."""
    from paracheck.world._failures import hide_harness_stack

    shown = hide_harness_stack(_HUNG).splitlines()
    assert shown == [
        "... 1 paracheck thread hidden (PARACHECK_FULL_TRACEBACK=1 shows them)",
        "Current thread 0x00007fa9ba5d8b80 (most recent call first):",
        "  ... 2 paracheck frames counting collectives hidden (PARACHECK_FULL_TRACEBACK=1 shows "
        "them)",
        '  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce',
        '  File "/home/me/ddp.py", line 28 in finish_gradient_synchronization',
        "  ... 3 paracheck frames and 1 library frame calling your code hidden "
        "(PARACHECK_FULL_TRACEBACK=1 shows them)",
    ], shown
    own = _HUNG.replace("/home/me/ddp.py", "/x/paracheck/check/ranks/_sync.py")
    assert hide_harness_stack(own) == own
    error = RankError("hung", [RankFailure(0, "hung", _HUNG)])
    assert "_rank.py" not in error.report() and _HUNG.rstrip() in error.report(full=True)


def test_paracheck_s_call_into_torch_is_kept_and_its_own_error_is_whole():
    """With no frame of the user's, the last paracheck frame (what it called in torch) stays; an
    error raised inside paracheck keeps every frame."""
    torch_raised = _HARNESS + _TORCH_CALL + "KeyError: 'lr'\n"
    shown = hide_harness_frames(torch_raised)
    assert "... 2 paracheck frames hidden" in shown
    assert "_drive.py" in shown and "_rank.py" not in shown and shown.endswith("KeyError: 'lr'\n")
    own_error = _HARNESS + "AttributeError: no attribute 'x'\n"
    assert hide_harness_frames(own_error) == own_error


def test_a_world_error_report_hides_paracheck_frames_unless_asked(monkeypatch):
    """``report()`` shows a raised rank's traceback from the user's code; ``full=True`` or
    ``PARACHECK_FULL_TRACEBACK=1`` keeps every frame."""
    text = _HARNESS + _TORCH_CALL + _USER
    error = RankError("1 rank(s) raised", [RankFailure(0, "raised", text)])
    assert "_rank.py" not in error.report() and "hidden" in error.report()
    assert text.rstrip() in error.report(full=True)
    monkeypatch.setenv("PARACHECK_FULL_TRACEBACK", "1")
    assert text.rstrip() in error.report()


# -- whose objects torch raised on --------------------------------------------------------------


class _GroupsWithoutLr(torch.optim.Optimizer):
    """An optimizer of the user's whose param_groups have no 'lr'."""

    def __init__(self, params):
        super().__init__(params, {})


# A stand-in for paracheck's rank program: its frames are paracheck's (the file name says so).
_HARNESS_CODE = compile(
    "def build(optimizer):\n    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)\n",
    "/x/paracheck/cases/_optimizer.py",
    "exec",
)


def _raised_in_scheduler(optimizer) -> BaseException:
    space = {"torch": torch}
    exec(_HARNESS_CODE, space)
    try:
        space["build"](optimizer)
    except Exception as exc:  # noqa: BLE001 - the exception is what is tested
        return exc
    raise AssertionError("StepLR did not raise")


def test_torch_raising_on_the_targets_param_groups_is_the_targets():
    """StepLR built by paracheck on the user's optimizer whose groups lack 'lr': the sentence names
    the user's object, the key, its groups and the torch module that reads it."""
    w = torch.nn.Parameter(torch.ones(2))
    said = blame(_raised_in_scheduler(_GroupsWithoutLr([w])))
    assert said == (
        "the target's optimizer (_GroupsWithoutLr) param_groups lack 'lr' (group 0 of 1), which "
        "torch.optim.lr_scheduler reads (StepLR.__init__)"
    )


def test_torch_raising_on_torchs_own_objects_is_no_one_elses():
    """The same KeyError on torch's own SGD (built by paracheck) names no object of the user's:
    paracheck's harness raised."""
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    del sgd.param_groups[0]["lr"]
    assert blame(_raised_in_scheduler(sgd)) is None


_HARNESS_LR = compile(
    "def apply_lr_schedule(case, optimizer):\n"
    "    for group in optimizer.param_groups:\n"
    "        group['lr'] *= 0.5\n",
    "/x/paracheck/cases/_optimizer.py",
    "exec",
)


def _raised_in_harness(optimizer) -> BaseException:
    space: dict = {}
    exec(_HARNESS_LR, space)
    try:
        space["apply_lr_schedule"](None, optimizer)
    except Exception as exc:  # noqa: BLE001 - the exception is what is tested
        return exc
    raise AssertionError("the schedule did not raise")


def test_paracheck_reading_the_targets_missing_lr_is_the_targets():
    """paracheck's own LR schedule reading 'lr' from the user's groups that lack it names the
    user's object; the same on torch's own SGD, or another KeyError, names no one."""
    w = torch.nn.Parameter(torch.ones(2))
    said = blame(_raised_in_harness(_GroupsWithoutLr([w])))
    assert said is not None and said.startswith(
        "the target's optimizer (_GroupsWithoutLr) param_groups lack 'lr' (group 0 of 1), which "
        "paracheck reads (apply_lr_schedule)"
    ), said
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    del sgd.param_groups[0]["lr"]
    assert blame(_raised_in_harness(sgd)) is None


# -- through a World, as a check reports it ----------------------------------------------------


@pytest.fixture(scope="module")
def pair():
    with World(2, timeout=30.0) as w:
        yield w


def test_a_schedulers_keyerror_on_the_targets_groups_is_reported_as_the_targets(pair):
    """A sharded optimizer whose param_groups drop 'lr', checked with an LR scheduler: the failure
    is the target's, named with its optimizer's param_groups, not "paracheck's harness raised";
    the traceback shown starts without paracheck's frames."""
    case = Case(
        model=MLPSpec(in_features=2, widths=(2,)),
        world_size=2,
        batch_sizes=(1, 1),
        steps=1,
        seed=0,
        optimizer=OptimizerSpec(
            name="sgd", groups=(GroupSpec(params=(), lr=0.1),), scheduler="step"
        ),
    )
    result = run_case(pair, PARAMS_ONLY, case)
    assert result.failed_properties == ["raised"], result.describe()
    failure = PropertyFailure("raised", result, kind="sharded")
    assert failure.meaning.startswith("your code's objects raised on rank "), failure.meaning
    assert (
        "the target's optimizer (ParamsOnlyGroupsShardedOptimizer) param_groups lack 'lr' "
        "(group 0 of 1), which torch.optim.lr_scheduler reads" in failure.meaning
    )
    assert "harness" not in failure.meaning and "param_groups" in failure.fix
    shown = result.describe("raised")
    assert "paracheck frames hidden" in shown and "world/_rank.py" not in shown
