"""Every property is declared once, in ``paracheck.check.properties.catalog``: the kinds' rows
name only declared properties, every selected name but ``equivalence`` has one check, and the
``--properties`` help and the guide's table of properties are written from the declarations.
``python tests/unit/test_property_table.py --write`` rewrites the table in ``docs/guide.md``
(without ``--write`` it prints it)."""

from __future__ import annotations

import sys
from pathlib import Path

from paracheck.check.kinds import KINDS, PROPERTY_CHECKS, properties_help, property_table
from paracheck.check.properties.catalog import PROPERTIES, selectors

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide.md"
HEADING = "## Properties the harness checks"


def _guide_table(text: str) -> tuple[int, int]:
    """Where the table under ``HEADING`` starts and ends in the guide's ``text``."""
    start = text.index("\n|", text.index(HEADING)) + 1
    end = start
    while end < len(text) and text.startswith("|", end):
        end = text.index("\n", end) + 1
    return start, end


def test_kinds_name_only_declared_properties():
    """Every property a kind's row names is a name ``--properties`` selects, and every such name
    is checked by some kind."""
    named = {p for row in KINDS.values() for p in row.properties}
    assert named <= set(selectors()), sorted(named - set(selectors()))
    assert set(selectors()) <= named, sorted(set(selectors()) - named)


def test_every_selected_name_has_one_check():
    """``equivalence`` is compared by its own function; every other selected name has exactly one
    row that checks it."""
    assert set(PROPERTY_CHECKS) == set(selectors()) - {"equivalence"}
    for name in PROPERTY_CHECKS:
        rows = [p.name for p in PROPERTIES.values() if p.check and p.selector == name]
        assert len(rows) == 1, (name, rows)


def test_every_property_is_described():
    """Each row says what a failure means, what fixes it, what must hold and what it catches."""
    for p in PROPERTIES.values():
        assert p.meaning and p.hint and p.holds and p.catches, p.name
        assert "|" not in p.holds + p.catches, p.name  # a cell of the guide's table
        assert p.oracle in ("yes", "no", "the float64 one"), p.name
        assert set(p.for_kinds) <= set(KINDS), p.name


def test_properties_help_names_every_kinds_properties():
    """The help of ``paracheck check --properties`` is written from the kinds' rows."""
    from paracheck.check.settings import OPTIONS

    (option,) = [o for o in OPTIONS if o.name == "properties"]
    assert option.help == properties_help()
    for row in KINDS.values():
        assert row.name in option.help
        for p in row.properties:
            assert p in option.help, (row.name, p)


def test_guide_table_is_generated():
    """The guide's table of properties is ``property_table()``, one row per declared property."""
    text = GUIDE.read_text()
    start, end = _guide_table(text)
    assert text[start:end] == property_table(), (
        "docs/guide.md's table of properties is stale: run "
        "python tests/unit/test_property_table.py --write"
    )
    assert property_table().count("\n") == len(PROPERTIES) + 2


def write_table() -> None:
    text = GUIDE.read_text()
    start, end = _guide_table(text)
    GUIDE.write_text(text[:start] + property_table() + text[end:])


if __name__ == "__main__":
    if "--write" in sys.argv:
        write_table()
    else:
        print(property_table(), end="")
