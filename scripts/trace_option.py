"""Follow one option of ``paracheck check`` from the command line to the first job a rank
receives, and count the steps, the files and the returns to a file left earlier.

    .venv/bin/python scripts/trace_option.py --option world_sizes [--json PATH]

The check runs in this process (``paracheck.cli.main``) on the built-in ``naive`` at world sizes
1 and 2, one example, every optional feature off, no database and no budget, under
``sys.settrace`` in the driver's main thread; tracing stops at the first ``Target.job`` (or a
``RankJob`` built directly), where the rank job is built. The ranks themselves are not traced.

What counts as a step
    A step is a call of a function defined under ``src/paracheck`` (comprehensions and lambdas
    belong to the function they are written in) that receives the option's value among its
    arguments: positional, keyword, ``*args`` items, ``**kwargs`` values, or an item of a tuple
    or list argument of up to 16 items (``argv``, the plans). An argument carries the value when
    it is

    - the text as typed on the command line (``"1,2"``), a ``str`` equal to it;
    - the parsed value, of its own type: a tuple or list of integers equal to ``(1, 2)`` for
      ``world_sizes``, a collection of names whose set is the features turned off for
      ``features``; for ``precision`` the text is the value;
    - an object (a dataclass such as ``CheckSettings`` or ``CheckPlan``, an
      ``argparse.Namespace``, any object's ``__dict__``) with a field named like the option
      (``world_sizes``; ``precision``; ``features`` or ``features_off``) holding either of the
      above; or a dataclass or ``Namespace`` one field further down holding such an object
      (``search.settings.world_sizes``).

    Equality, not identity: a sorted copy of the tuple is the same value. A field named
    otherwise (``self.sizes``) does not carry it, so the value can leave the trace there.
    The last step is the call that builds the rank job, whatever it receives (a case drawn at
    one of the sizes).

What the figures are
    ``steps``: the calls above, in order. ``files``: the distinct files they are in. ``returns``:
    how many times the trace enters a file it had left earlier (a run of consecutive steps in one
    file counts once). ``calls receiving the text itself``: steps given the text as an argument
    (not as an item of ``argv`` or in a field): where the text is read. ``parse sites``: calls
    that received the text and not the parsed value and returned the parsed value (or an object
    carrying it; a tuple or list of such objects); the innermost of them (no parse site below
    them) is where the text is really parsed, so "parsed once" is one innermost parse call; for
    ``precision``, whose text is the value, no call parses it. ``origin sites``: calls that
    received no carrier of the value and returned one: a default applied, or the value read back
    from a field named otherwise (for ``features``, with every feature off, also each call that
    computes the set of optional features: the parsed value is that set). ``default names``:
    read from the source with ``ast``, every use of a constant named ``*_<OPTION>``
    (``DEFAULT_WORLD_SIZES``, ``MAIN_JOB_WORLD_SIZES``) or a call of a function named
    ``*default_<option>``, with the function it is in.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import io
import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "paracheck"
TARGET = "naive"
WORLD_SIZES_TEXT = "1,2"
_GENERATOR_FLAGS = 0x20 | 0x80 | 0x200  # CO_GENERATOR, CO_COROUTINE, CO_ASYNC_GENERATOR
_VARARGS, _VARKEYWORDS = 0x04, 0x08
_ITEMS = 16  # a tuple or list up to this long is looked into, item by item (``argv``, plans)


@dataclass(frozen=True)
class Followed:
    """One option to follow: its flag and text on the command line, the value it parses to, the
    field names that carry it and the extra command-line options it needs."""

    name: str
    text: str
    parsed: object
    fields: tuple[str, ...]
    extra: tuple[str, ...] = ()

    def form(self, value) -> str | None:
        """'text', 'parsed' or None: what ``value`` itself is of this option."""
        if type(value) is str:
            return "text" if value == self.text else None
        if isinstance(self.parsed, tuple) and isinstance(value, (tuple, list)):
            # Element types first: a tuple of tensors compared with integers would not be a bool.
            same = len(value) == len(self.parsed) and all(type(v) is int for v in value)
            return "parsed" if same and tuple(value) == self.parsed else None
        if isinstance(self.parsed, frozenset) and isinstance(value, (tuple, list, set, frozenset)):
            if value and all(type(v) is str for v in value) and set(value) == self.parsed:
                return "parsed"
        return None


def followed(name: str) -> Followed:
    """The option ``name`` (``world_sizes``, ``precision`` or ``features``) as this run gives it."""
    from paracheck.check.features import optional_features

    off = optional_features()
    if name == "world_sizes":
        sizes = tuple(int(s) for s in WORLD_SIZES_TEXT.split(","))
        return Followed(name, WORLD_SIZES_TEXT, sizes, ("world_sizes",))
    if name == "precision":
        return Followed(name, "fp32", "fp32", ("precision",), ("--precision", "fp32"))
    if name == "features":
        text = ",".join("-" + f for f in off)
        return Followed(name, text, frozenset(off), ("features", "features_off"))
    raise SystemExit(f"--option={name!r} must be one of world_sizes, precision, features")


def command(option: Followed) -> list[str]:
    """The ``paracheck`` arguments of the traced run."""
    from paracheck.check.features import optional_features

    features = ",".join("-" + f for f in optional_features())
    return [
        "check",
        TARGET,
        "--world-sizes",
        WORLD_SIZES_TEXT,
        "--max-examples",
        "1",
        "--no-database",
        "--budget",
        "0",
        f"--features={features}",
        *option.extra,
    ]


def _attributes(value) -> dict:
    if isinstance(value, type):
        return {}
    if dataclasses.is_dataclass(value):
        return {f.name: getattr(value, f.name, None) for f in dataclasses.fields(value)}
    try:
        return dict(vars(value))
    except TypeError:
        return {}


def carrier(value, option: Followed, depth: int = 2) -> tuple[str, str] | None:
    """(form, how) when ``value`` carries the option (the module docstring's rule), else None."""
    form = option.form(value)
    if form is not None:
        return form, form
    if depth == 2 and isinstance(value, (tuple, list)) and len(value) <= _ITEMS:
        for i, item in enumerate(value):
            found = carrier(item, option, depth - 1)
            if found is not None:
                return found[0], f"[{i}] {found[1]}"
    if depth == 0 or type(value) in (str, int, float, bool, tuple, list, dict, set):
        return None
    attributes = _attributes(value)
    for name in option.fields:
        if name in attributes:
            form = option.form(attributes[name])
            if form is not None:
                return form, f"{type(value).__name__}.{name} ({form})"
    if depth > 1:
        for name, inner in attributes.items():
            if dataclasses.is_dataclass(inner) or isinstance(inner, argparse.Namespace):
                found = carrier(inner, option, depth - 1)
                if found is not None:
                    return found[0], f"{type(value).__name__}.{name}.{found[1]}"
    return None


def _returned(value, option: Followed) -> str | None:
    found = carrier(value, option)
    return None if found is None else found[0]


@dataclass
class Step:
    function: str
    file: str
    line: int
    carried: str  # "argument: how", joined by "; "
    end: bool = False
    text: bool = False  # an argument is the text itself (not an item or a field holding it)
    # A new pass through its file: no caller of this call is in the file (the value is handed
    # to the module afresh, not to a function the module's own unfinished call reached), and the
    # value is handed as an argument, not held by ``self``: a method of the object that holds it
    # reads or writes that object).
    enters: bool = True
    read: bool = False  # ``self`` carries it: a method of the object holding the value


@dataclass
class Site:
    function: str
    file: str
    line: int
    innermost: bool


@dataclass
class _Frame:
    code: object
    forms: frozenset[str]
    inner_parse: bool = False
    inner_origin: bool = False


@dataclass
class Trace:
    """What one traced run found (the module docstring defines each figure)."""

    option: str
    steps: list[Step] = field(default_factory=list)
    parse_sites: list[Site] = field(default_factory=list)
    origin_sites: list[Site] = field(default_factory=list)
    reached_job: bool = False
    exit_code: int | None = None
    output: str = ""

    @property
    def files(self) -> list[str]:
        return list(dict.fromkeys(s.file for s in self.steps))

    @property
    def returns(self) -> int:
        runs = [
            f
            for i, f in enumerate(s.file for s in self.steps)
            if i == 0 or self.steps[i - 1].file != f
        ]
        return sum(1 for i, f in enumerate(runs) if f in runs[:i])

    @property
    def passes(self) -> dict[str, int]:
        """Per file, the passes of the value through it: the steps that enter it afresh."""
        out: dict[str, int] = {}
        for s in self.steps:
            out[s.file] = out.get(s.file, 0) + s.enters
        return out

    def figures(self) -> dict:
        innermost = [s for s in self.parse_sites if s.innermost]
        origins = [s for s in self.origin_sites if s.innermost]
        return {
            "option": self.option,
            "steps": len(self.steps),
            "files": len(self.files),
            "functions": len({(s.file, s.function) for s in self.steps}),
            "returns": self.returns,
            "passes": self.passes,
            "files_passed_again": sorted(f for f, n in self.passes.items() if n > 1),
            "passes_again": sum(n - 1 for n in self.passes.values() if n > 1),
            "reached_job": self.reached_job,
            "text_calls": sum(s.text for s in self.steps),
            "parse_calls": len(self.parse_sites),
            "parsed_innermost": len(innermost),
            "origin_calls": len(self.origin_sites),
            "origins_innermost": len(origins),
            "trace": [dataclasses.asdict(s) for s in self.steps],
            "parse_sites": [dataclasses.asdict(s) for s in self.parse_sites],
            "origin_sites": [dataclasses.asdict(s) for s in self.origin_sites],
            "file_list": self.files,
        }


def _relative(filename: str) -> str:
    return os.path.relpath(filename, PACKAGE.parent)


def _arguments(frame) -> list[tuple[str, object]]:
    code = frame.f_code
    n = code.co_argcount + code.co_kwonlyargcount
    names = list(code.co_varnames[:n])
    local = frame.f_locals
    out = [(name, local.get(name)) for name in names]
    if code.co_flags & _VARARGS:
        star = code.co_varnames[n]
        out += [(f"*{star}[{i}]", v) for i, v in enumerate(local.get(star) or ())]
        n += 1
    if code.co_flags & _VARKEYWORDS:
        out += [(f"**{k}", v) for k, v in (local.get(code.co_varnames[n]) or {}).items()]
    return out


class Tracer:
    """``sys.settrace``'s function: a step for each call under ``root`` receiving the value,
    parse and origin sites at their returns, off at the first call of a code in ``stop``."""

    def __init__(self, option: Followed, root: str, stop: set):
        self.option, self.root, self.stop = option, root, stop
        self.trace = Trace(option.name)
        self.stack: list[_Frame] = []
        self.resumed: dict[int, object] = {}  # generator frames seen, kept alive while traced
        self.done = False

    def __call__(self, frame, event, arg):
        if self.done or event != "call":
            return None
        code = frame.f_code
        if code in self.stop:
            case = frame.f_locals.get("case")
            size = getattr(case, "world_size", None)
            at = "" if size is None else f" for a case at world size {size}"
            self._step(frame, "the rank job is built" + at, end=True)
            self.trace.reached_job, self.done = True, True
            sys.settrace(None)
            return None
        if not code.co_filename.startswith(self.root) or code.co_name.startswith("<"):
            return None  # a comprehension or lambda is part of the function it is written in
        generator = code.co_flags & _GENERATOR_FLAGS
        if generator:
            if id(frame) in self.resumed:
                return None  # a resumed generator is the call already counted
            self.resumed[id(frame)] = frame
        found = [(n, c) for n, v in _arguments(frame) if (c := carrier(v, self.option)) is not None]
        if found:
            text = any(c[1] == "text" for _, c in found)
            read = any(n == "self" for n, _ in found)
            self._step(frame, "; ".join(f"{n}: {c[1]}" for n, c in found), text=text, read=read)
        if generator:
            return None  # it returns at each yield: no parse or origin site is read from it
        self.stack.append(_Frame(code, frozenset(c[0] for _, c in found)))
        frame.f_trace_lines = False
        return self._local

    def _step(
        self, frame, carried: str, end: bool = False, text: bool = False, read: bool = False
    ) -> None:
        code = frame.f_code
        where = (code.co_qualname, _relative(code.co_filename), code.co_firstlineno)
        callers, up = set(), frame.f_back
        while up is not None:
            callers.add(up.f_code.co_filename)
            up = up.f_back
        enters = code.co_filename not in callers and not read
        self.trace.steps.append(Step(*where, carried, end, text, enters, read))

    def _local(self, frame, event, arg):
        if event != "return" or not self.stack or self.stack[-1].code is not frame.f_code:
            return self._local
        top = self.stack.pop()
        if self.done:
            return None
        form = None if self.option.text == self.option.parsed else _returned(arg, self.option)
        code = frame.f_code
        site = (code.co_qualname, _relative(code.co_filename), code.co_firstlineno)
        if form == "parsed" and top.forms == {"text"}:
            self.trace.parse_sites.append(Site(*site, innermost=not top.inner_parse))
            for f in self.stack:
                f.inner_parse = True
        elif form is not None and not top.forms:
            self.trace.origin_sites.append(Site(*site, innermost=not top.inner_origin))
            for f in self.stack:
                f.inner_origin = True
        return None


def run(option: Followed, main: Callable | None = None, argv: list[str] | None = None) -> Trace:
    """Trace ``main(argv)`` (``paracheck.cli.main`` on ``command(option)``) in this thread; its
    output is swallowed."""
    from paracheck.check.ranks.job import RankJob
    from paracheck.check.targets import Target

    if main is None:
        from paracheck.cli import main
    argv = command(option) if argv is None else argv
    stop = {Target.job.__code__, RankJob.__init__.__code__}
    tracer = Tracer(option, str(PACKAGE) + os.sep, stop)
    before = sys.gettrace()
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            sys.settrace(tracer)
            try:
                status = main(argv)
            finally:
                sys.settrace(before)
    finally:
        tracer.resumed.clear()
    tracer.trace.exit_code = status
    tracer.trace.output = sink.getvalue()
    return tracer.trace


def default_names(option: str, package: Path = PACKAGE) -> list[dict]:
    """Every use, under ``package``, of a constant named ``*_<OPTION>`` or a call of a function
    named ``*default_<option>``: (name, file, line, the function it is in; "<module>" at the top
    level), read with ``ast``. A constant's definition is not a use."""
    constant = re.compile(rf"^[A-Z0-9_]*_{option.upper()}$")
    function = re.compile(rf"^_?(\w+_)?default_{option}$")
    out = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for scope, node in _walk(tree, "<module>"):
            name = _name(node)
            if name is None:
                continue
            use = constant.match(name) and isinstance(getattr(node, "ctx", None), ast.Load)
            call = isinstance(node, ast.Call) and function.match(name)
            if use or call:
                out.append(
                    {
                        "name": name,
                        "file": _relative(str(path)),
                        "line": node.lineno,
                        "function": scope,
                    }
                )
    return out


def _walk(node, scope: str):
    for child in ast.iter_child_nodes(node):
        inner = scope
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner = child.name if scope == "<module>" else f"{scope}.{child.name}"
        yield inner, child
        yield from _walk(child, inner)


def _name(node) -> str | None:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def table(trace: Trace, defaults: list[dict]) -> str:
    """The trace and its figures as text."""
    option = followed(trace.option)
    lines = [f"option {trace.option}: {' '.join(['paracheck', *command(option)])}"]
    lines.append(f"{'#':>3}  {'function':<40} {'where':<44} carried by")
    for i, s in enumerate(trace.steps, 1):
        where = f"{s.file}:{s.line}"
        mark = " " if s.enters else ("r" if s.read else ".")
        lines.append(f"{i:>3} {mark}{s.function:<40} {where:<44} {s.carried}")
    f = trace.figures()
    lines += [
        "",
        f"steps {f['steps']} ({f['functions']} functions), files {f['files']}, "
        f"returns to a file left earlier {f['returns']}"
        + ("" if trace.reached_job else " (the rank job was not reached)"),
        f"passes through a file after its first ('.': a call its file's own unfinished call "
        f"reached; 'r': a method of the object holding the value; neither is a pass): "
        f"{f['passes_again']}"
        + "".join(f"\n    {name} x{f['passes'][name]}" for name in f["files_passed_again"]),
        f"calls receiving the text itself: {f['text_calls']}"
        + _sites([Site(s.function, s.file, s.line, False) for s in trace.steps if s.text]),
        f"parse sites: {f['parse_calls']} calls, {f['parsed_innermost']} innermost"
        + (" (the text is the value)" if option.text == option.parsed else "")
        + _sites(trace.parse_sites),
        f"origin sites (no carrier received, one returned): {f['origin_calls']} calls, "
        f"{f['origins_innermost']} innermost" + _sites(trace.origin_sites),
        f"default names in the source: {len(defaults)} uses",
        *(f"    {d['name']} in {d['function']} at {d['file']}:{d['line']}" for d in defaults),
    ]
    return "\n".join(lines)


def _sites(sites: list[Site]) -> str:
    """One line per function, in order of its first call, with its number of calls."""
    counts: dict[tuple, int] = {}
    for s in sites:
        key = (s.function, s.file, s.line, s.innermost)
        counts[key] = counts.get(key, 0) + 1
    return "".join(
        f"\n    {name} at {file}:{line}"
        + (f" x{n}" if n > 1 else "")
        + (" (innermost)" if innermost else "")
        for (name, file, line, innermost), n in counts.items()
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--option", default="world_sizes", help="world_sizes, precision or features")
    p.add_argument("--json", metavar="PATH", default=None, help="also write the figures here")
    args = p.parse_args(argv)
    option = followed(args.option.replace("-", "_"))
    trace = run(option)
    defaults = default_names(option.name)
    print(table(trace, defaults))
    if args.json is not None:
        data = {**trace.figures(), "command": command(option), "default_names": defaults}
        data["exit_code"] = trace.exit_code
        with open(args.json, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
    if not trace.reached_job:
        print(trace.output[-2000:], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
