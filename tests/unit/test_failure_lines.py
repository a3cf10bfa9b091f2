"""What a failure's lines show without opening a file: the case line names every field that
differs from its default, got and expected print differently where they differ, and the replay
command runs from any directory without carrying the case's JSON."""

import os
import shlex
from dataclasses import replace

from paracheck.cases import Case, GroupSpec, OptimizerSpec
from paracheck.check.failure import case_line, replay_command
from paracheck.check.properties._divergence import two_numbers
from paracheck.check.targets import Target, resolve_target
from paracheck.workloads.mlp import MLPSpec


def test_case_line_names_each_group_option_that_differs_from_its_default():
    """The sharded-optimizer failure whose cause was one group's weight decay: the line says it,
    and every other field off its default too (betas, a late group, clip, precision, seed)."""
    case = Case(
        model=MLPSpec(widths=(1,), buffer=True),
        steps=2,
        optimizer=OptimizerSpec(
            name="adam",
            groups=(
                GroupSpec(params=(), weight_decay=0.1, betas=(0.8, 0.999)),
                GroupSpec(params=(1,), momentum=0.5, add_at_step=1),
            ),
            scheduler="step",
        ),
        clip_norm=0.25,
        dtype="float32",
        autocast="bfloat16",
        seed=7,
        no_sync=True,
        accumulation=2,
    )
    line = case_line(case)
    for words in (
        "W=2 mlp[1](buffer) adamx2g",
        "g0{weight_decay=0.1, betas=[0.8,0.999]}",
        "g1{params=[1], momentum=0.5, add_at_step=1}",
        "scheduler=step",
        "steps=2 acc=2",
        "no_sync",
        "clip_norm=0.25",
        "dtype=float32",
        "autocast=bfloat16",
        "seed=7",
    ):
        assert words in line, (words, line)


def test_case_line_of_a_default_case_is_its_head_only():
    assert case_line(Case()) == "W=2 mlp[3] sgdx1g steps=2 acc=1 bucket=25MB"


def test_case_line_names_every_field_off_its_default():
    """Each field of Case set away from its default appears on the line (a future field too)."""
    import dataclasses

    shown_in_head = {"model", "world_size", "optimizer", "steps", "accumulation"}
    shown_in_head |= {"bucket_size_mb", "unbounded_bucket", "batch_sizes"}
    changed = {
        "seed": 3,
        "rank_dependent_init": True,
        "set_to_none": False,
        "merged_ranks": 2,
        "closure": True,
        "zero_grad_module": True,
        "double_backward": True,
        "prefetch": 2,
    }
    line = case_line(replace(Case(), **changed))
    for name in changed:
        assert name in line, (name, line)
    fields = {f.name for f in dataclasses.fields(Case)} - shown_in_head
    assert set(changed) <= fields


def test_got_and_expected_print_differently_where_they_differ():
    """1.424854e-01 against 1.424854e-01 with a difference of 8.6e-14 read as no difference."""
    got, expected = 0.1424854, 0.1424854 + 8.6e-14
    a, b = two_numbers(got, expected)
    assert a != b and float(a) == got and float(b) > got
    assert two_numbers(0.5, 0.5) == ("5.000000e-01", "5.000000e-01")
    assert two_numbers(1.0, 2.0) == ("1.000000e+00", "2.000000e+00")


def _replay_parts(command: str) -> list[str]:
    return shlex.split(command.split(" && ", 1)[-1])


def test_replay_names_the_case_file_by_its_absolute_path_without_a_database(tmp_path, monkeypatch):
    """No case_file given (no database, the pytest plugin): the case goes to a file of the
    temporary directory, named by its absolute path, and the command stays short."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    case = Case(optimizer=OptimizerSpec(name="adamw", groups=(GroupSpec(params=()),)))
    command = replay_command(resolve_target("naive"), case)
    parts = _replay_parts(command)
    path = parts[parts.index("--case") + 1]
    assert os.path.isabs(path) and path.startswith(str(tmp_path)), command
    assert Case.from_json(open(path).read()) == case
    assert len(command) < 200 + len(path), command
    assert "{" not in command


def test_replay_names_a_file_target_and_the_given_case_file_by_absolute_paths(
    tmp_path, monkeypatch
):
    """A file target and a case file given relative to the directory of the check are named
    absolute, so the command works from any directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_ddp.py").write_text("from paracheck.ddp import FlatDDP as MyDDP\n")
    target = Target("my_ddp.py:MyDDP", f"{tmp_path}/my_ddp.py:MyDDP", "ddp")
    command = replay_command(target, Case(), case_file=".paracheck/cases/x.json")
    parts = _replay_parts(command)
    assert parts[2] == f"{tmp_path}/my_ddp.py:MyDDP", command
    assert parts[parts.index("--case") + 1] == f"{tmp_path}/.paracheck/cases/x.json"


def test_replay_of_a_package_found_only_here_runs_from_here(tmp_path, monkeypatch):
    """A project's package imported through the working directory: the replay goes there first;
    an installed one (paracheck's own) needs no cd."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "myproj_only_here").mkdir()
    (tmp_path / "myproj_only_here" / "__init__.py").write_text("")
    here = Target("myproj_only_here:DDP", "myproj_only_here:DDP", "ddp")
    command = replay_command(here, Case(), case_file="c.json")
    assert command.startswith(f"cd {shlex.quote(str(tmp_path))} && paracheck check "), command
    installed = Target("paracheck.ddp:FlatDDP", "paracheck.ddp:FlatDDP", "ddp")
    assert replay_command(installed, Case(), case_file="c.json").startswith("paracheck check ")


def test_a_difference_just_past_its_allowance_prints_differently_from_it():
    """A divergence 1e-9 past its tolerance of 1e-5 printed "1.000e-05, largest allowed
    1.000e-05", which reads as no failure; the worst element's line likewise."""
    import torch

    from paracheck.check.properties._divergence import Divergence
    from paracheck.check.properties.closeness import worst_element

    line = Divergence(0, "param", 1, 0, "w", 1.0001e-5, 1e-5).describe()
    assert "= 1.0001e-05, largest allowed 1.0000e-05" in line, line
    assert (
        "= 5.000e-01, largest allowed 0.000e+00"
        in Divergence(0, "grad", 0, 0, "w", 0.5, 0.0).describe()
    )
    ref = torch.tensor([1.0], dtype=torch.float64)
    words = worst_element(ref + 2.000001e-6, ref, 1e-6)  # allowed: 1e-6 * (1 + 1)
    diff, allowed = words.split("|got - expected| = ")[1].split(" where ")
    assert diff != allowed.removesuffix(" is allowed"), words


def test_case_line_prints_a_bucket_cap_with_every_digit_it_has():
    """Two bucket caps a byte apart bucket differently; printed with two digits they read alike."""
    one_byte = 1 / 2**20
    a = case_line(replace(Case(), bucket_size_mb=36 * one_byte))
    b = case_line(replace(Case(), bucket_size_mb=35 * one_byte))
    assert a != b and f"bucket={36 * one_byte!r}MB" in a, (a, b)
    assert case_line(replace(Case(), bucket_size_mb=0.5)).endswith("bucket=0.5MB")
