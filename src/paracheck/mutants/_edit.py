"""Mutants built from the production source: a function or method with one line edited."""

from __future__ import annotations

import inspect
import linecache
import textwrap

__all__ = ["edited"]


def edited(fn, *edits: tuple[str, str], name: str | None = None):
    """``fn`` compiled again from its own source with each ``(text, replacement)`` of ``edits``
    applied: the production code plus the bug and nothing else, so the two cannot drift apart.
    Each ``text`` must occur exactly once. Decorators are dropped; ``name`` renames the function.
    It runs in ``fn``'s module globals, so every name resolves as in the original; a method that
    calls ``super()`` without arguments cannot be edited this way (it has no ``__class__`` cell).
    The source is registered with ``linecache`` under a name of its own, so tracebacks show the
    edited lines and ``inspect.getsource`` (which ``triton.jit`` reads) finds them."""
    source = textwrap.dedent(inspect.getsource(fn))
    source = source[source.index(f"def {fn.__name__}(") :]  # without its decorators
    label = name or fn.__name__
    if name is not None:
        source = source.replace(f"def {fn.__name__}(", f"def {name}(", 1)
    for old, new in edits:
        if source.count(old) != 1:
            raise ValueError(
                f"{label}: {old.strip()!r} occurs {source.count(old)} times in "
                f"{fn.__qualname__}, not once: the mutant is out of date"
            )
        source = source.replace(old, new)
    filename = f"<paracheck.mutants:{fn.__module__}.{fn.__qualname__} as {label}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace: dict = {}
    exec(compile(source, filename, "exec"), fn.__globals__, namespace)
    return namespace[label]
