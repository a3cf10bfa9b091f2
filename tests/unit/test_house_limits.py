"""The house limits on the size of ``src/paracheck``: no file above 600 lines, no function above
120 lines (a function's decorators count), read from the source with ``ast``, never by importing.
A file that outgrows them is split by concern; a function, into named steps."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "paracheck"
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 120

# Files exempt from both limits, relative to src/paracheck, each with its reason: none.
ALLOWED: set[str] = set()
# Vendored code (not ours to split) is not Python: report/_www/ holds asv's and jQuery's
# JavaScript and CSS, which the Python files below never include.


def _python_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def test_the_allowed_files_exist():
    """Every exemption names a file that exists, so a stale entry is noticed and removed."""
    missing = sorted(name for name in ALLOWED if not (PACKAGE / name).is_file())
    assert not missing, f"exempt files that do not exist: {missing}"


def test_no_file_above_the_limit():
    """No Python file of ``src/paracheck`` outside the exemptions is above 600 lines."""
    long = []
    for path in _python_files():
        n = len(path.read_text().splitlines())
        if n > MAX_FILE_LINES and _relative(path) not in ALLOWED:
            long.append(f"{_relative(path)}: {n} lines")
    assert not long, f"files above {MAX_FILE_LINES} lines (split them by concern):\n" + "\n".join(
        long
    )


def long_functions(source: str) -> list[tuple[str, int, int]]:
    """(name, line, lines) of every function or method of ``source`` above the limit, its
    decorators counted."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            n = (node.end_lineno or node.lineno) - start + 1
            if n > MAX_FUNCTION_LINES:
                out.append((node.name, node.lineno, n))
    return out


def test_no_function_above_the_limit():
    """No function or method of ``src/paracheck`` outside the exemptions is above 120 lines."""
    long = [
        f"{_relative(path)}:{line} {name}: {n} lines"
        for path in _python_files()
        if _relative(path) not in ALLOWED
        for name, line, n in long_functions(path.read_text())
    ]
    assert not long, (
        f"functions above {MAX_FUNCTION_LINES} lines (split them into named steps):\n"
        + "\n".join(long)
    )


def test_a_function_one_line_too_long_is_found():
    """A method of 121 lines, its decorator counted, is found; one of 120 is not."""
    body = "".join(f"        x{i} = {i}\n" for i in range(118))
    at_limit = f"class C:\n    @staticmethod\n    def f():\n{body}"
    assert long_functions(at_limit) == []
    assert long_functions(at_limit + "        y = 0\n") == [("f", 3, MAX_FUNCTION_LINES + 1)]
