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
