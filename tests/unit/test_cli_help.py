"""Every subcommand and every option of ``paracheck`` has help text, and an option with a default
says what it is."""

import argparse

import pytest

from paracheck.cli import _parser


def _actions():
    top, commands = _parser()
    for name, sub in commands.items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            yield name, action


def test_every_subcommand_has_help():
    top, commands = _parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    helped = {c.dest: c.help for c in sub._choices_actions}
    missing = sorted(n for n in commands if not helped.get(n))
    assert not missing, f"subcommands without help: {missing}"


@pytest.mark.parametrize(
    "command,action", list(_actions()), ids=lambda x: x if isinstance(x, str) else x.dest
)
def test_every_option_has_help_with_its_default(command, action):
    what = f"paracheck {command} {'/'.join(action.option_strings) or action.dest}"
    assert action.help and action.help != argparse.SUPPRESS, f"{what} has no help"
    default = action.default
    flag = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
    if flag or action.required or not action.option_strings:
        return
    text = action.help % {"default": default, "prog": "paracheck", "dest": action.dest}
    assert "default" in text, f"{what}: default {default!r} not stated in {text!r}"


def test_kind_accepts_every_kind():
    """``--kind`` offers every kind the checker has (fsdp included)."""
    from paracheck.check.kinds import KINDS

    top, commands = _parser()
    kind = next(a for a in commands["check"]._actions if "--kind" in a.option_strings)
    assert list(kind.choices) == list(KINDS)
    assert "fsdp" in kind.choices


def test_each_subcommand_has_its_own_one_line_description():
    """``paracheck --help`` gives each subcommand a distinct line, no RST markup anywhere."""
    top, commands = _parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    lines = {c.dest: c.help for c in sub._choices_actions}
    assert len(set(lines.values())) == len(lines), lines
    assert all("\n" not in line for line in lines.values())
    texts = [top.format_help(), *(p.format_help() for p in commands.values())]
    assert not [t for t in texts if "``" in t]


def test_version(capsys):
    """``paracheck --version`` prints the package's version and exits 0."""
    import paracheck
    from paracheck.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"paracheck {paracheck.__version__}"


def test_check_help_names_every_builtin_and_both_path_forms():
    """``paracheck check --help`` lists the built-in targets and the two import-path forms."""
    from paracheck.check.targets import BUILTIN_TARGETS

    text = _parser()[1]["check"].format_help()
    missing = [n for n in BUILTIN_TARGETS if n not in text]
    assert not missing, f"built-ins not in check --help: {missing}"
    assert "file.py:Name" in text and "package.module:Class" in text
