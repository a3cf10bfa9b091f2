"""Names that comments, docstrings and documents point at exist.

* Every ``Note [Name]`` referenced in the source or the documents is defined exactly once in
  ``src/``. A definition is a line whose text, without a leading ``#``, is ``Note [Name]`` alone
  (the note's body follows on the next lines) or starts with ``Note [Name]:`` (the body follows
  on the same line).
* Every double-backquoted dotted name ``paracheck.x.y`` in ``src/`` (and every backquoted one, and
  every ``from paracheck.x import y`` of a code block, in the documents) imports: the longest
  importable module prefix, then attributes.
* Every backquoted repository path (``scripts/x.py``, ``docs/x.md``, ``ddp/bucketed.py`` below
  ``src/paracheck``) exists.
* The index of notes in ``docs/architecture.md`` lists exactly the notes defined in ``src/``,
  each with the file that defines it. ``python tests/unit/test_references.py --write`` rewrites
  the index there (without ``--write`` it prints it).
"""

from __future__ import annotations

import importlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PACKAGE = SRC / "paracheck"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
INDEX_HEADING = "## Index of notes"

_NOTE = re.compile(r"Note \[([^\]]+)\]")
_DEFINITION = re.compile(r"^Note \[([^\]]+)\](:.*)?$")
_DOTTED_CODE = re.compile(r"``(paracheck(?:\.\w+)+)")  # ``paracheck.x.y`` or ``paracheck.x.f()``
_DOTTED_DOC = re.compile(r"`(paracheck(?:\.\w+)+)")
_FROM_IMPORT = re.compile(r"^\s*from (paracheck[\w.]*) import ([\w, ()]+)$")
_PATH = re.compile(r"`+([\w./-]+\.(?:py|md|sh|json|yml|yaml|toml|txt))\b")
# Paths in a user's repository, shown as examples.
_EXAMPLE_PATHS = re.compile(r"^(path/to/|tests/adapters\.py$)")


@dataclass(frozen=True)
class Hit:
    path: Path
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: {self.name}"


def _source_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "_www" not in p.parts)


def _code_files() -> list[Path]:
    """Python files that may point at notes and names: the package, tests, benchmarks, scripts."""
    files = _source_files()
    for folder in ("tests", "benchmarks", "scripts", "experiments", "examples"):
        files += sorted(p for p in (ROOT / folder).rglob("*.py") if ".asv" not in p.parts)
    return [p for p in files if p != Path(__file__).resolve()]  # this file names examples


def _document_files() -> list[Path]:
    docs = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    docs += sorted(ROOT.glob("*/README.md"))
    return [p for p in docs if p.is_file()]


def _prose(path: Path) -> tuple[str, list[int]]:
    """The file's text with comment markers dropped and lines joined by spaces (a name may wrap
    onto the next comment line), and the offset at which each line starts."""
    starts, parts, offset = [], [], 0
    for line in path.read_text().splitlines():
        text = line.strip()
        if path.suffix == ".py":
            text = text.lstrip("#").strip()
        starts.append(offset)
        parts.append(text)
        offset += len(text) + 1
    return " ".join(parts), starts


def _line_of(starts: list[int], offset: int) -> int:
    lo, hi = 0, len(starts) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if starts[mid] <= offset:
            lo = mid
        else:
            hi = mid - 1
    return lo + 1


def _name(raw: str) -> str:
    return " ".join(raw.split())


def note_definitions() -> list[Hit]:
    hits = []
    for path in _source_files():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            m = _DEFINITION.match(line.strip().lstrip("#").strip())
            if m:
                hits.append(Hit(path, number, _name(m.group(1))))
    return hits


def note_references() -> list[Hit]:
    hits = []
    for path in _code_files() + _document_files():
        text, starts = _prose(path)
        for m in _NOTE.finditer(text):
            hits.append(Hit(path, _line_of(starts, m.start()), _name(m.group(1))))
    return hits


def _unresolved(dotted: str) -> str | None:
    """Why ``dotted`` does not resolve (None when it does): the longest importable module prefix,
    then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name is not None and module.startswith(e.name):
                continue  # this prefix is not a module: try a shorter one
            return f"{module} does not import: {e}"
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return f"{type(obj).__name__} {obj.__name__!r} has no {attr!r}"
            obj = getattr(obj, attr)
        return None
    return "no module"


def dotted_names() -> list[Hit]:
    hits = []
    for path in _code_files() + _document_files():
        pattern = _DOTTED_CODE if path.suffix == ".py" else _DOTTED_DOC
        text, starts = _prose(path)
        for m in pattern.finditer(text):
            hits.append(Hit(path, _line_of(starts, m.start()), m.group(1)))
        if path.suffix == ".md":  # the imports of code blocks: ``from paracheck.x import a, b``
            for number, line in enumerate(path.read_text().splitlines(), 1):
                m = _FROM_IMPORT.match(line)
                for name in m.group(2).split(",") if m else ():
                    name = name.split(" as ")[0].strip(" ()")
                    hits += [Hit(path, number, f"{m.group(1)}.{name}")] if name else []
    return hits


def repository_paths() -> list[Hit]:
    hits = []
    for path in _code_files() + _document_files():
        text, starts = _prose(path)
        for m in _PATH.finditer(text):
            name = m.group(1)
            # Bare file names (``cases.py``) are read next to their neighbours.
            if "/" in name and not _EXAMPLE_PATHS.match(name):
                hits.append(Hit(path, _line_of(starts, m.start()), name))
    return hits


def _path_exists(hit: Hit) -> bool:
    bases = [ROOT, SRC, PACKAGE, hit.path.parent]
    return any((base / hit.name.lstrip("/")).exists() for base in bases)


def notes_index() -> str:
    """The markdown table for ``docs/architecture.md``: every note and the file defining it."""
    rows = sorted(note_definitions(), key=lambda h: (str(h.path), h.line))
    lines = ["| note | defined in |", "| --- | --- |"]
    lines += [f"| Note [{h.name}] | `{h.path.relative_to(SRC)}` |" for h in rows]
    return "\n".join(lines)


def _index_rows(markdown: str) -> set[tuple[str, str]]:
    section = markdown.split(INDEX_HEADING, 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| Note \[([^\]]+)\] \| `([^`]+)` \|$", section, re.M))


def test_every_referenced_note_is_defined():
    """A ``Note [Name]`` reference names a note that ``src/`` defines."""
    defined = {h.name for h in note_definitions()}
    dangling = [str(h) for h in note_references() if h.name not in defined]
    assert not dangling, "notes referenced but never defined:\n" + "\n".join(dangling)


def test_every_note_is_defined_once():
    """No two definitions share a name, so a reference has one place to go."""
    seen: dict[str, Hit] = {}
    twice = []
    for h in note_definitions():
        if h.name in seen:
            twice.append(f"{h} (also {seen[h.name]})")
        seen.setdefault(h.name, h)
    assert not twice, "notes defined twice:\n" + "\n".join(twice)


def test_dotted_names_import():
    """A ``paracheck.x.y`` named in a docstring, comment or document imports."""
    missing = sorted({f"{h} ({why})" for h in dotted_names() if (why := _unresolved(h.name))})
    assert not missing, "dotted names that do not import:\n" + "\n".join(missing)


def test_repository_paths_exist():
    """A backquoted path (``scripts/x.py``, ``ddp/bucketed.py``) names a file of this repository."""
    missing = sorted({str(h) for h in repository_paths() if not _path_exists(h)})
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_architecture_index_lists_every_note():
    """docs/architecture.md's index of notes equals the notes ``src/`` defines, file by file."""
    if not ARCHITECTURE.is_file():
        pytest.fail(f"{ARCHITECTURE.relative_to(ROOT)} is missing")
    listed = _index_rows(ARCHITECTURE.read_text())
    defined = {(h.name, str(h.path.relative_to(SRC))) for h in note_definitions()}
    assert listed == defined, (
        f"index out of date: not listed {sorted(defined - listed)}, "
        f"listed but not defined there {sorted(listed - defined)}; "
        "regenerate it with `python tests/unit/test_references.py --write`"
    )


def write_index() -> None:
    """Replace the table under ``INDEX_HEADING`` in ``docs/architecture.md`` with ``notes_index()``."""
    text = ARCHITECTURE.read_text()
    head, rest = text.split(INDEX_HEADING, 1)
    section, sep, tail = rest.partition("\n## ")
    prose = [line for line in section.strip("\n").splitlines() if not line.startswith("|")]
    section = "\n".join(prose).rstrip() + "\n\n" + notes_index() + "\n"
    ARCHITECTURE.write_text(head + INDEX_HEADING + "\n\n" + section + (sep and "\n" + sep + tail))


if __name__ == "__main__":
    # python tests/unit/test_references.py [--write]: print the index, or write it into the doc.
    if "--write" in sys.argv[1:]:
        write_index()
    else:
        print(notes_index())
