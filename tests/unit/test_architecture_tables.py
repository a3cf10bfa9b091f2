"""The lists of ``docs/architecture.md`` that name the code's tables are generated from the tables:
the kinds (``paracheck.check.kinds.KINDS``: rank program, strategy, properties), the properties
(``paracheck.check.properties.catalog.PROPERTIES``) and the public strategies
(``paracheck.strategies.__all__``). Each list sits between a ``<!-- generated: NAME -->`` line and
the next ``<!-- end -->``; the test fails when a list and its table disagree.
``python tests/unit/test_architecture_tables.py --write`` rewrites the lists (without ``--write``
it prints them).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
_BLOCK = re.compile(r"(<!-- generated: (\w+) -->\n)(.*?)(<!-- end -->)", re.S)


def _code(text: str) -> str:
    return f"`{text}`"


def kinds_table() -> str:
    from paracheck.check.kinds import KINDS

    lines = [
        "| kind | rank program | case strategy | properties by default | on request |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, kind in KINDS.items():
        lines.append(
            f"| `{name}` | {_code(kind.rank_fn)} | {_code(kind.strategy)} | "
            f"{', '.join(kind.default)} | {', '.join(kind.opt_in) or '-'} |"
        )
    return "\n".join(lines) + "\n"


def properties_table() -> str:
    from paracheck.check.kinds import KINDS
    from paracheck.check.properties.catalog import PROPERTIES

    lines = ["| property | what a failure means | kinds that check it |", "| --- | --- | --- |"]
    for name, prop in PROPERTIES.items():
        # A property judged as part of another (``selected_by``) is checked where that one is;
        # one named by no row and by no other is judged on every case of every kind.
        selector = prop.selected_by or name
        kinds = [k for k, row in KINDS.items() if selector in row.properties]
        where = ", ".join(kinds) or "every kind, every case"
        if prop.selected_by:
            where += f" (with `{prop.selected_by}`)"
        meaning = prop.meaning.replace("|", "\\|")
        lines.append(f"| `{name}` | {meaning} | {where} |")
    return "\n".join(lines) + "\n"


def strategies_list() -> str:
    import paracheck.strategies as strategies

    return "".join(f"- `paracheck.strategies.{name}`\n" for name in strategies.__all__)


GENERATED = {"kinds": kinds_table, "properties": properties_table, "strategies": strategies_list}


def _blocks(text: str) -> dict[str, str]:
    return {m.group(2): m.group(3) for m in _BLOCK.finditer(text)}


def rewritten(text: str) -> str:
    """``text`` with every generated list made anew."""

    def one(m: re.Match) -> str:
        return m.group(1) + GENERATED[m.group(2)]() + m.group(4)

    return _BLOCK.sub(one, text)


def test_every_generated_list_is_in_the_document():
    """The document holds one block for each generated list, and no block of an unknown name."""
    names = [m.group(2) for m in _BLOCK.finditer(ARCHITECTURE.read_text())]
    assert sorted(names) == sorted(GENERATED), names


def test_generated_lists_match_the_tables():
    """Each list in the document is what its table generates now."""
    blocks = _blocks(ARCHITECTURE.read_text())
    stale = [name for name, make in GENERATED.items() if blocks.get(name) != make()]
    assert not stale, (
        f"stale lists in docs/architecture.md: {stale}; run "
        "python tests/unit/test_architecture_tables.py --write"
    )


def test_a_stale_list_is_found():
    """A list that lost a row is rewritten whole."""
    block = "<!-- generated: kinds -->\n| `ddp` | x |\n<!-- end -->"
    out = rewritten(block)
    assert out != block and "`loop`" in out and out.endswith("<!-- end -->")


if __name__ == "__main__":
    new = rewritten(ARCHITECTURE.read_text())
    if "--write" in sys.argv:
        ARCHITECTURE.write_text(new)
    else:
        for name, make in GENERATED.items():
            print(f"<!-- generated: {name} -->\n{make()}<!-- end -->")
