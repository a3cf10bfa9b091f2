"""No code outside the kinds table tests a target's kind by its name: what a kind does is a field
of its row (``paracheck.check.kinds.KINDS``), so a new kind is one row and not a hunt for every
``kind == "loop"``. The reader is shown to find planted tests."""

from __future__ import annotations

import ast
import pathlib

from paracheck.check.kinds import KINDS

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"
TABLE = "paracheck/check/kinds.py"

# Comparisons with a string that happens to be a kind's name but compare something else, by file
# and the other operand's source, with what it is.
NOT_KINDS = {
    ("paracheck/accounting/memory.py", "design"): "the memory model's designs (zero1, torch-ddp)",
    (
        "paracheck/check/targets.py",
        "cls.__name__.lower().replace('_', '')",
    ): "a class's name, read where a kind is inferred from it",
}


def _strings(node: ast.AST) -> list[str]:
    """The string constants ``node`` is, or holds as a tuple, list or set."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [s for e in node.elts for s in _strings(e)]
    return []


def kind_tests(path: pathlib.Path, where: str) -> list[tuple[int, str]]:
    """The (line, source) of each comparison (or ``match`` case) in ``path`` of something with a
    kind's name, but those ``NOT_KINDS`` lists for ``where``."""
    names, found = set(KINDS), []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            named = [o for o in operands if set(_strings(o)) & names]
            others = [ast.unparse(o) for o in operands if o not in named]
            if named and not all((where, o) in NOT_KINDS for o in others):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.MatchValue) and set(_strings(node.value)) & names:
            found.append((node.lineno, f"case {ast.unparse(node.value)}"))
    return found


def test_no_kind_is_tested_by_name_outside_the_table():
    rows = [
        f"{where}:{line}: {source}"
        for path in sorted((SRC / "paracheck").rglob("*.py"))
        if (where := path.relative_to(SRC).as_posix()) != TABLE
        for line, source in kind_tests(path, where)
    ]
    assert not rows, (
        "a kind tested by its name outside paracheck/check/kinds.py; make what it stands for a "
        "field of the kind's row and read the row:\n" + "\n".join(rows)
    )


def test_a_kind_tested_by_name_is_found(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "def f(target, kind, args, design, spec):\n"
        "    if target.kind == 'loop':\n"
        "        pass\n"
        "    if kind in ('ddp', 'fsdp') or 'sharded' != args.kind:\n"
        "        pass\n"
        "    if spec.kind == 'mlp' or design == 'zero2':\n"  # a workload; a design elsewhere
        "        pass\n"
        "    match kind:\n"
        "        case 'zero':\n"
        "            pass\n"
    )
    found = kind_tests(planted, "paracheck/planted.py")
    assert sorted(line for line, _ in found) == [2, 4, 4, 6, 9], found
    # The same design comparison where NOT_KINDS lists it is not a kind's test.
    elsewhere = kind_tests(planted, "paracheck/accounting/memory.py")
    assert sorted(line for line, _ in elsewhere) == [2, 4, 4, 9], elsewhere
