"""The example database: the failing cases of a check, saved as ``Case`` JSON and replayed first by
the next check of the same target, then dropped once they pass.

Note [Saved cases]
    A check saves the case of every failing property it reports (shrunk, or as given) under its
    target (``path|kind``), one JSON file per (case, property), written whole and renamed into
    place so that two pytest-xdist workers never read half a file. The next check of that target
    runs the saved cases before any new search, against the target's code as it is now: a case
    that still fails is reported at once (as it was saved: it is not shrunk again), and one that
    passes every property it was saved under is deleted, as Hypothesis deletes a database entry
    that no longer fails. A saved case is kept, and not run, when this check would not draw it: a
    world size outside the ones asked for, another dtype, or a feature turned off (``--features``,
    ``--contract``); replaying it would check what the user has excluded.

    Hypothesis's own database cannot do this here. It is turned off by ``hypothesis.seed()`` and
    refused with ``derandomize=True``, which is how every reproducible check runs; and it stores
    the choices Hypothesis made, not the case: the same choices make another case as soon as the
    world sizes, the features drawn, the search they belonged to (one per property) or paracheck's
    strategies change. A ``Case`` is the case itself; it loads from any later paracheck (new
    fields come with defaults), and it is what ``paracheck check --case`` replays.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from paracheck.cases import Case

__all__ = ["CaseDatabase", "SavedCase"]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class SavedCase:
    """One file of the database: a case that broke ``property`` of a target checked for
    ``properties`` (None: the kind's defaults were not recorded). ``error`` says why a file that
    no longer loads was not read; its ``case`` is then None."""

    file: Path
    case: Case | None
    property: str
    properties: frozenset[str] | None
    error: str | None = None


class CaseDatabase:
    """The saved failing cases under directory ``path`` (created on the first save); see
    Note [Saved cases]."""

    def __init__(self, path):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(
                f"database={path!r} must be a directory path (str or os.PathLike) or None"
            )
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"CaseDatabase({str(self.path)!r})"

    def _dir(self, key: str) -> Path:
        return self.path / _digest(key)

    def cases(self, key: str) -> list[SavedCase]:
        """The cases saved under target ``key``, smallest first (then by file name)."""
        folder = self._dir(key)
        if not folder.is_dir():
            return []
        out = []
        for file in sorted(folder.glob("*.json")):
            try:
                data = json.loads(file.read_text())
                case = Case.from_dict(data["case"])
                props = data.get("properties")
                out.append(
                    SavedCase(
                        file,
                        case,
                        str(data["property"]),
                        None if props is None else frozenset(props),
                    )
                )
            except Exception as exc:  # noqa: BLE001 - any unreadable file is reported and dropped
                out.append(SavedCase(file, None, "", None, f"{type(exc).__name__}: {exc}"))
        return sorted(out, key=lambda s: (s.case is not None, len(_text(s)), s.file.name))

    def save(self, key: str, case: Case, prop: str, properties=None) -> Path:
        """Save ``case`` as breaking ``prop`` of target ``key`` (checked for ``properties``)."""
        text = case.to_json()
        folder = self._dir(key)
        file = folder / f"{_digest(prop + chr(10) + text)}.json"
        data = {
            "target": key,
            "property": prop,
            "properties": None if properties is None else sorted(properties),
            "case": case.to_dict(),
        }
        for attempt in range(3):
            folder.mkdir(parents=True, exist_ok=True)
            try:
                fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
                break
            except FileNotFoundError:  # another process removed the emptied folder meanwhile
                if attempt == 2:
                    raise
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(data, indent=1) + "\n")
            os.replace(tmp, file)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return file

    def delete(self, saved: SavedCase) -> None:
        saved.file.unlink(missing_ok=True)
        try:
            saved.file.parent.rmdir()  # the target's folder, once empty
        except OSError:
            pass


def _text(saved: SavedCase) -> str:
    return "" if saved.case is None else saved.case.to_json()
